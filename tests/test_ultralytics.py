"""Ultralytics registration: our blocks scale like C2f at every scale, YAML names resolve, checkpoints reload."""

from __future__ import annotations

import copy
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import yolo_bimamba  # noqa: F401  (registers the blocks)
from yolo_bimamba import ultralytics_glue as glue

glue.register()

import ultralytics.nn.tasks as tasks  # noqa: E402
from ultralytics.nn.modules import C2f  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCALES = {  # yolov8's compound scaling constants, including l and x that our YAML does not list
    "n": [0.33, 0.25, 1024],
    "s": [0.33, 0.50, 1024],
    "m": [0.67, 0.75, 768],
    "l": [1.00, 1.00, 512],
    "x": [1.00, 1.25, 512],
}


def _our_yaml():
    return yaml.safe_load((REPO / "cfg" / "yolov8-bimamba.yaml").read_text())


def _block_classes():
    return glue.blocks()


def _as_c2f(d):
    d = copy.deepcopy(d)
    for sec in ("backbone", "head"):
        for row in d[sec]:
            if row[2] in _block_classes():
                row[2] = "C2f"
                row[3] = [a for a in row[3] if not isinstance(a, dict)]
    return d


def _with_block(d, name):
    d = copy.deepcopy(d)
    for sec in ("backbone", "head"):
        for row in d[sec]:
            if row[2] in _block_classes():
                row[2] = name
    return d


def _expected(c2_yaml, n_yaml, depth, width, max_channels):
    c2 = math.ceil(min(c2_yaml, max_channels) * width / 8) * 8
    n = max(round(n_yaml * depth), 1) if n_yaml > 1 else n_yaml
    return c2, n


def test_register_is_idempotent_and_names_resolvable():
    pm = tasks.parse_model
    glue.register()
    glue.register()
    assert tasks.parse_model is pm
    assert not hasattr(pm._yolo_bimamba_original, "_yolo_bimamba_original")  # wrapped exactly once
    for name, cls in _block_classes().items():
        assert getattr(tasks, name) is cls
    assert "C2fBiMamba" in _block_classes()


@pytest.mark.parametrize("block", ["C2fBiMamba", "C2fHydra"])
@pytest.mark.parametrize("scale", list(SCALES))
def test_blocks_scale_like_c2f(block, scale):
    classes = _block_classes()
    assert block in classes, f"{block} is not registered (blocks found: {sorted(classes)})"
    cls = classes[block]
    depth, width, max_channels = SCALES[scale]
    d = _with_block(_our_yaml(), block)
    d["scales"], d["scale"], d["nc"] = SCALES, scale, 10
    ours, save = tasks.parse_model(copy.deepcopy(d), ch=3, verbose=False)
    ref, save_ref = tasks.parse_model(_as_c2f(d), ch=3, verbose=False)
    assert save == save_ref and len(ours) == len(ref)

    rows = d["backbone"] + d["head"]
    n_blocks = 0
    for i, (row, a, b) in enumerate(zip(rows, ours, ref)):
        assert (a.i, a.f) == (b.i, b.f) == (i, row[0])
        if row[2] != block:
            # (Ultralytics 8.3.0 stores np on the class, not the layer: compare real counts)
            assert type(a) is type(b)
            assert sum(p.numel() for p in a.parameters()) == sum(p.numel() for p in b.parameters())
            continue
        n_blocks += 1
        assert type(a) is cls and type(b) is C2f
        assert a.type == f"{cls.__module__}.{cls.__qualname__}"
        c2, n = _expected(row[3][0], row[1], depth, width, max_channels)
        # channels / repeats as Ultralytics resolved them for the equivalent C2f ...
        assert (a.cv1.conv.in_channels, a.cv2.conv.out_channels, len(a.m)) == (
            b.cv1.conv.in_channels, b.cv2.conv.out_channels, len(b.m))
        # ... and as the width / depth / max_channels rules say
        assert a.cv2.conv.out_channels == c2 and len(a.m) == n
        assert a.c == b.c == int(c2 * 0.5)
        assert a.np == sum(p.numel() for p in a.parameters())
        shortcut = bool(row[3][1]) if len(row[3]) > 1 else False
        direct = cls(a.cv1.conv.in_channels, c2, n, shortcut)
        assert a.np == sum(p.numel() for p in direct.parameters())
    assert n_blocks == 6

    x = torch.zeros(1, 3, 64, 64)  # the rebuilt layers chain: a forward pass through the backbone works
    y = x
    for layer in list(ours)[:10]:
        y = layer(y)
    assert y.shape[1] == ours[9].cv2.conv.out_channels and torch.isfinite(y).all()


def test_trailing_dict_goes_to_block_kwargs_and_log_shows_block():
    d = _our_yaml()
    d["scale"], d["nc"] = "n", 10
    d["backbone"][6][3] = [512, True, {"d_state": 16, "headdim": 16}]
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = tasks.LOGGER
    logger.addHandler(handler)
    try:
        model, _ = tasks.parse_model(copy.deepcopy(d), ch=3, verbose=True)
    finally:
        logger.removeHandler(handler)
    mixer = model[6].m[0].mixer
    assert (mixer.d_state, mixer.headdim) == (16, 16)
    assert model[8].m[0].mixer.d_state != 16  # other rows keep the defaults
    lines = [r.getMessage() for r in records]
    row6 = [ln for ln in lines if ln[:3].strip() == "6" and "C2fBiMamba" in ln]
    assert len(row6) == 1 and f"{model[6].np:10d}" in row6[0] and "'d_state': 16" in row6[0]
    assert not any("block.C2f " in ln for ln in lines if ln[:3].strip() in {"6", "8", "12", "15", "18", "21"})


def test_bad_rows_raise():
    d = _our_yaml()
    d["scale"], d["nc"] = "n", 10
    d["backbone"][6][3] = [{"d_state": 16}]
    with pytest.raises(ValueError, match="c2"):
        tasks.parse_model(copy.deepcopy(d), ch=3, verbose=False)


def test_bimamba_alias_matches():
    a = yaml.safe_load((REPO / "cfg" / "bimamba.yaml").read_text())
    b = yaml.safe_load((REPO / "cfg" / "yolov8-bimamba-p5.yaml").read_text())
    assert {k: a[k] for k in ("nc", "scales", "backbone", "head")} == {k: b[k] for k in ("nc", "scales", "backbone", "head")}


def test_yaml_names_resolve_from_any_directory(tmp_path, monkeypatch):
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.nn.tasks import yaml_model_load
    from ultralytics.utils.checks import check_yaml

    monkeypatch.chdir(tmp_path)
    for name in ("yolov8-bimamba.yaml", "bimamba.yaml"):
        p = Path(check_yaml(name))
        assert p.is_file() and p.name == name
    for name, scale in (("yolov8n-bimamba.yaml", "n"), ("yolov8s-bimamba.yaml", "s"), ("yolov8m-bimamba.yaml", "m")):
        d = yaml_model_load(name)
        assert d["scale"] == scale and d["backbone"][6][2] == "C2fBiMamba"
    d = yaml_model_load("bimamba.yaml")
    assert d["backbone"][10][2] == "C2fBiMamba" and [r[2] for r in d["backbone"] + d["head"]].count("C2fBiMamba") == 1

    data = check_det_dataset("digits-tiny.yaml")
    assert data["nc"] == 10 and list(data["names"].values()) == [str(i) for i in range(10)]
    train = Path(data["train"])
    assert train.is_absolute() and len(list(train.glob("*.png"))) == 48
    assert len(list(Path(data["val"]).glob("*.png"))) == 16
    assert check_det_dataset("digits-tiny")["train"] == data["train"]  # bare dataset name
    # a descriptor given by path is built too
    assert check_det_dataset(str(REPO / "cfg" / "digits-tiny.yaml"))["train"] == data["train"]
    # a local file of the same name wins over ours
    (tmp_path / "bimamba.yaml").write_text("nc: 1\n")
    assert check_yaml("bimamba.yaml") == "bimamba.yaml"


def test_dataset_is_deterministic(tmp_path):
    from yolo_bimamba.data import build_digits_dataset

    kw = dict(imgsz=48, n_train=6, n_val=3, seed=3)
    a = build_digits_dataset(root=tmp_path / "a", **kw).parent
    b = build_digits_dataset(root=tmp_path / "b", **kw).parent
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name != "data.yaml")
    assert len(files) == 18
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes()
    labels = [ln.split() for f in files if f.suffix == ".txt" for ln in (a / f).read_text().splitlines()]
    assert labels and all(0 <= int(c) <= 9 and all(0 < float(v) <= 1 for v in xywh) for c, *xywh in labels)
    # cached: a second call returns the same YAML without rebuilding
    t = (a / "images" / "train" / "train_00000.png").stat().st_mtime_ns
    assert build_digits_dataset(root=tmp_path / "a", **kw) == a / "data.yaml"
    assert (a / "images" / "train" / "train_00000.png").stat().st_mtime_ns == t
    with pytest.raises(ValueError, match="unknown"):
        build_digits_dataset(root=tmp_path, bogus=1)


def _subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("YOLO_OFFLINE", "true")
    env.setdefault("YOLO_AUTOINSTALL", "0")
    return env


def test_saved_model_reloads_in_fresh_process(tmp_path):
    from ultralytics import YOLO

    model = YOLO("yolov8n-bimamba.yaml")
    det = model.model
    det.train()
    with torch.no_grad():  # move BN statistics away from their init
        for _ in range(2):
            det(torch.rand(2, 3, 64, 64))
    det.eval()
    path = tmp_path / "m.pt"
    torch.save({"model": copy.deepcopy(det), "train_args": {"imgsz": 64}}, path)
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        ref = det(x)[0]
    script = f"""
import sys, torch
from ultralytics import YOLO
m = YOLO({str(path)!r})
assert type(m.model.model[6]).__name__ == "C2fBiMamba", type(m.model.model[6])
assert "yolo_bimamba" in sys.modules
with torch.no_grad():
    y = m.model.eval()(torch.load({str(tmp_path / 'x.pt')!r}))[0]
torch.save(y, {str(tmp_path / 'y.pt')!r})
"""
    r = subprocess.run([sys.executable, "-c", script], env=_subprocess_env(), capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    y = torch.load(tmp_path / "y.pt")
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_p5_yaml_is_yolov8_plus_one_global_block(tmp_path, monkeypatch):
    """cfg/yolov8-bimamba-p5.yaml: Ultralytics' yolov8 layout, one C2fBiMamba after SPPF, head indices shifted."""
    from ultralytics.nn.tasks import DetectionModel, yaml_model_load

    monkeypatch.chdir(tmp_path)
    ours, plain = yaml_model_load("yolov8s-bimamba-p5.yaml"), yaml_model_load("yolov8s.yaml")
    assert ours["scale"] == "s" and ours["scales"] == {k: plain["scales"][k] for k in ("n", "s", "m")}
    assert ours["backbone"][:10] == plain["backbone"]
    assert ours["backbone"][10][:3] == [-1, 1, "C2fBiMamba"]

    def shifted(f):  # SPPF's output (9) is now the BiMamba block's (10); later rows move down by one
        return [shifted(i) for i in f] if isinstance(f, list) else (f + 1 if f >= 9 else f)

    assert [[shifted(r[0])] + r[1:] for r in plain["head"]] == ours["head"]
    torch.manual_seed(0)
    m, ref = DetectionModel("yolov8n-bimamba-p5.yaml", nc=10, verbose=False), DetectionModel("yolov8n.yaml", nc=10, verbose=False)
    assert type(m.model[10]).__name__ == "C2fBiMamba"
    x = torch.rand(2, 3, 96, 96)
    from torch.utils._pytree import tree_leaves

    out, out_ref = tree_leaves(m.train()(x)), tree_leaves(ref.train()(x))
    assert out and [o.shape for o in out] == [o.shape for o in out_ref]
    sum(o.float().sum() for o in out).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.model[10].parameters())
