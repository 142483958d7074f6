"""The Fashion-MNIST scene builder (yolo_bimamba.fashion_scenes) and the dataset sources for machines without the
Debian package or scikit-learn. Needs Debian's dataset-fashion-mnist package (CI installs it)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from yolo_bimamba import data as D
from yolo_bimamba import fashion_scenes as F

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(imgsz=96, n_train=10, n_val=4, min_size=0.15, max_size=0.6, pool_train=400, pool_val=100)


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.name != "data.yaml":
            h.update(f.relative_to(folder).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def test_fashion_mnist_source_is_installed():
    x, y = F.load_fashion_mnist("test")
    assert x.shape == (10000, 28, 28) and x.dtype == np.uint8 and sorted(set(y.tolist())) == list(range(10))
    with pytest.raises(ValueError, match="split"):
        F.load_fashion_mnist("val")


def test_fashion_scenes_deterministic_labelled_and_worker_independent(tmp_path):
    a = F.build_fashion_dataset(root=tmp_path / "a", workers=1, **SMALL)
    b = F.build_fashion_dataset(root=tmp_path / "b", workers=2, **{**SMALL})
    assert a.parent.name == b.parent.name and _digest(a.parent) == _digest(b.parent)
    assert F.build_fashion_dataset(root=tmp_path / "a", **SMALL) == a  # cached: same path, no rebuild
    c = F.build_fashion_dataset(root=tmp_path / "c", **{**SMALL, "seed": 1})
    assert _digest(c.parent) != _digest(a.parent)

    import yaml

    meta = yaml.safe_load(a.read_text())
    assert meta["nc"] == 10 and meta["names"][9] == "Ankle boot" and Path(meta["path"]) == a.parent
    from PIL import Image

    n_boxes, sizes = 0, []
    for split, n in (("train", 10), ("val", 4)):
        imgs = sorted((a.parent / "images" / split).glob("*.jpg"))
        assert len(imgs) == n
        with Image.open(imgs[0]) as im:
            assert im.size == (96, 96) and im.mode == "RGB"
        for lab in (a.parent / "labels" / split).glob("*.txt"):
            for line in lab.read_text().split("\n"):
                if not line:
                    continue
                c, x, y, w, h = line.split()
                x, y, w, h = map(float, (x, y, w, h))
                assert 0 <= int(c) < 10 and 0 < w <= 1 and 0 < h <= 1
                assert 0 <= x - w / 2 + 1e-6 and x + w / 2 <= 1 + 1e-6 and 0 <= y - h / 2 + 1e-6 and y + h / 2 <= 1 + 1e-6
                n_boxes += 1
                sizes.append(max(w, h))
    assert n_boxes >= 14  # at least one object per scene
    assert max(sizes) > 0.33  # large objects occur


def test_occlusion_rule_keeps_every_object_visible_enough():
    owner = np.full((20, 20), -1)
    owner[0:10, 0:10] = 0  # object 0: 100 pixels
    owner[10:20, 10:15] = 1  # object 1: 50 pixels
    areas = [100, 50]
    cover = np.zeros((20, 20), bool)
    cover[0:10, 0:5] = True  # hides 50 of object 0's pixels: exactly half
    assert F._fits(owner, cover, areas, keep=0.5)
    cover[0:10, 5] = True  # 60 hidden
    assert not F._fits(owner, cover, areas, keep=0.5)
    owner2 = owner.copy()
    owner2[0:10, 0:3] = -1  # object 0 already lost 30 pixels: hiding 30 more leaves 40 < 50
    cover2 = np.zeros((20, 20), bool)
    cover2[0:10, 3:6] = True
    assert not F._fits(owner2, cover2, areas, keep=0.5)
    assert F._fits(owner2, cover2, areas, keep=0.3)


def test_scenes_hold_valid_boxes():
    rng = np.random.default_rng(3)
    photos = np.zeros((5, 28, 28), np.uint8)
    photos[:, 4:24, 4:24] = 200
    p = F._params(imgsz=96, min_objects=6, max_objects=6, min_size=0.3, max_size=0.6, max_occlusion=0.5)
    for _ in range(5):
        img, boxes = F._scene(rng, p, photos, np.arange(5))
        assert img.shape == (96, 96, 3) and img.dtype == np.uint8 and boxes
        for c, x0, y0, x1, y1 in boxes:
            assert 0 <= c < 5 and 0 <= x0 < x1 <= 96 and 0 <= y0 < y1 <= 96


def test_fashion_params_are_checked():
    with pytest.raises(ValueError, match="unknown fashion dataset parameter"):
        F._params(bogus=1)
    with pytest.raises(ValueError, match="max_occlusion"):
        F._params(max_occlusion=1.0)
    with pytest.raises(ValueError, match="imgsz"):
        F._params(imgsz=32)


def test_descriptor_yaml_builds_fashion_through_the_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_BIMAMBA_CACHE", str(tmp_path))
    spec = D.dataset_spec(REPO / "cfg" / "fashion-tiny.yaml")
    assert spec["generator"] == "fashion" and spec["name"] == "fashion-tiny"
    built = Path(D.resolve_data_yaml(REPO / "cfg" / "fashion-tiny.yaml"))
    assert built.is_file() and built.parent.parent == tmp_path
    assert len(list((built.parent / "images" / "train").glob("*.jpg"))) == 24
    bad = tmp_path / "bad.yaml"
    bad.write_text("yolo_bimamba_dataset:\n  generator: nope\n")
    with pytest.raises(ValueError, match="unknown dataset generator"):
        D.dataset_spec(bad)


def test_scenes_from_shipped_sources_equal_the_originals(tmp_path):
    """A machine without the Debian package (fashion) or scikit-learn (digits) builds the same scenes from the
    sources written by write_sources."""
    ref_f = F.build_fashion_dataset(root=tmp_path / "ref", **SMALL)
    ref_d = D.build_digits_dataset(root=tmp_path / "ref", imgsz=64, n_train=6, n_val=2)
    ship = tmp_path / "ship"
    F.write_sources(ship, **SMALL)
    D.write_sources(ship)
    script = f"""
import sys
sys.modules["sklearn"] = None  # no scikit-learn on this machine
from yolo_bimamba import data as D, fashion_scenes as F
print(F.build_fashion_dataset(root={str(ship)!r}, **{SMALL!r}))
print(D.build_digits_dataset(root={str(ship)!r}, imgsz=64, n_train=6, n_val=2))
"""
    env = dict(os.environ, YOLO_BIMAMBA_FASHION_MNIST=str(tmp_path / "no-such-dir"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    f_yaml, d_yaml = (Path(s) for s in r.stdout.split())
    assert _digest(f_yaml.parent) == _digest(ref_f.parent)
    assert _digest(d_yaml.parent) == _digest(ref_d.parent)


def test_missing_sources_name_the_install_step(tmp_path, monkeypatch):
    monkeypatch.setenv("YOLO_BIMAMBA_FASHION_MNIST", str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        F.build_fashion_dataset(root=tmp_path, **SMALL)


@pytest.mark.parametrize("generator", ["digits", "fashion"])
def test_a_test_split_adds_scenes_and_changes_nothing_else(tmp_path, generator):
    """n_test > 0 adds images/test (other scenes from val's source pool) and a ``test:`` entry; train and val stay
    byte for byte, and without a test split the cache key is the one it was before test splits existed."""
    kw = dict(imgsz=64, n_train=4, n_val=3, min_size=0.25, max_size=0.45) if generator == "digits" else SMALL
    a = D.build_dataset(generator, root=tmp_path / "a", **kw).parent
    b = D.build_dataset(generator, root=tmp_path / "b", n_test=5, **kw).parent
    assert a.name != b.name
    for split in ("images/train", "labels/train", "images/val", "labels/val"):
        assert _digest(a / split) == _digest(b / split), split
    assert not (a / "images" / "test").exists() and "test:" not in (a / "data.yaml").read_text()
    assert "test: images/test" in (b / "data.yaml").read_text().splitlines()
    test_imgs = sorted((b / "images" / "test").iterdir())
    assert len(test_imgs) == 5 and len(list((b / "labels" / "test").iterdir())) == 5
    val_bytes = {f.read_bytes() for f in (b / "images" / "val").iterdir()}
    assert not any(f.read_bytes() in val_bytes for f in test_imgs)
    from ultralytics.data.utils import check_det_dataset

    assert Path(check_det_dataset(str(b / "data.yaml"))["test"]) == b / "images" / "test"
    # the default parameters' cache folders, as named before there were test splits
    assert D._key(D._params()) == "digits-8de8f5c52ebe"
    assert F._key(F._params(), F.VERSION) == "fashion-1e6eda5aa53c"
    with pytest.raises(ValueError, match="n_test >= 0"):
        D.build_dataset(generator, root=tmp_path / "c", n_test=-1, **kw)
