"""The default dataset: scenes composited from scikit-learn's handwritten digits, in YOLO detection format.

Everything is built offline and deterministically from ``sklearn.datasets.load_digits`` (1797 real 8x8 handwritten
digits that ship inside scikit-learn): every scene gets a textured background, a few digits upscaled to varied sizes at
random non-overlapping positions in random contrasting colours, and pixel noise. Train and val scenes draw from
disjoint sets of handwritten samples, so validation measures generalisation to unseen handwriting; test scenes
(``n_test`` > 0) are other scenes of val's samples, held out for reporting what was chosen on val.

A dataset is described by a small YAML (``cfg/digits.yaml``, ``cfg/digits-tiny.yaml``) holding a
``yolo_bimamba_dataset`` mapping of generator parameters. Ultralytics resolves ``data=digits.yaml`` through the hook
in :mod:`yolo_bimamba.ultralytics_glue`, which calls :func:`resolve_data_yaml`: the scenes are written once into a
cache directory keyed by the parameters, together with an ordinary Ultralytics data YAML with absolute paths.

Cache root: ``$YOLO_BIMAMBA_CACHE`` if set, else ``$XDG_CACHE_HOME/yolo-bimamba`` (default ``~/.cache/yolo-bimamba``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from . import config

__all__ = ["DEFAULTS", "GENERATORS", "build_dataset", "build_digits_dataset", "cache_root", "resolve_data_yaml",
           "dataset_spec"]

GENERATOR_KEY = "yolo_bimamba_dataset"
VERSION = 1  # bump when the scene recipe changes: it is part of the cache key

DEFAULTS = {
    "name": "digits",
    "imgsz": 160,  # square scene size in pixels
    "n_train": 320,
    "n_val": 80,
    "n_test": 0,  # test scenes: drawn afresh from val's handwriting (none of train's); 0: no test split
    "min_digits": 1,
    "max_digits": 3,
    "min_size": 0.18,  # digit box side as a fraction of imgsz
    "max_size": 0.40,
    "noise": 8.0,  # std of the additive pixel noise (0-255 scale)
    "seed": 0,
}
NAMES = [str(i) for i in range(10)]


def cache_root() -> Path:
    """Directory under which generated datasets are cached."""
    env = config.cache_dir()
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "yolo-bimamba"


def merged_params(what: str, defaults: dict, overrides: dict) -> dict:
    """``defaults`` updated with the ``overrides`` that are not None; an unknown key raises, naming ``what``."""
    unknown = set(overrides) - set(defaults)
    if unknown:
        raise ValueError(f"unknown {what} parameter(s) {sorted(unknown)}; valid: {sorted(defaults)}")
    return {**defaults, **{k: v for k, v in overrides.items() if v is not None}}


def _params(**overrides) -> dict:
    p = merged_params("digits dataset", DEFAULTS, overrides)
    p["imgsz"], p["n_train"], p["n_val"], p["n_test"] = (int(p[k]) for k in ("imgsz", "n_train", "n_val", "n_test"))
    p["min_digits"], p["max_digits"], p["seed"] = int(p["min_digits"]), int(p["max_digits"]), int(p["seed"])
    if p["imgsz"] < 32:
        raise ValueError(f"imgsz must be >= 32, got {p['imgsz']}")
    check_split_sizes(p)
    if not 1 <= p["min_digits"] <= p["max_digits"]:
        raise ValueError("need 1 <= min_digits <= max_digits")
    if not 0 < p["min_size"] <= p["max_size"] <= 0.9:
        raise ValueError("need 0 < min_size <= max_size <= 0.9")
    return p


def check_split_sizes(p: dict) -> None:
    if p["n_train"] < 1 or p["n_val"] < 1 or p["n_test"] < 0:
        raise ValueError(f"need n_train >= 1, n_val >= 1 and n_test >= 0, got {p['n_train']}, {p['n_val']}, "
                         f"{p['n_test']}")


def splits(p: dict) -> list[tuple[str, int]]:
    """(split, number of scenes) of a generated dataset: train, val, and test where ``n_test`` > 0."""
    return [("train", p["n_train"]), ("val", p["n_val"])] + ([("test", p["n_test"])] if p["n_test"] else [])


def _key(p: dict, version: int = VERSION) -> str:
    """Cache folder name: the dataset name and a hash of its parameters and recipe version (``n_test`` = 0 is left
    out, so a dataset without a test split keeps the key it had before there was one)."""
    q = {k: v for k, v in p.items() if k != "n_test" or v}
    blob = json.dumps({**q, "version": version}, sort_keys=True).encode()
    return f"{p['name']}-{hashlib.sha256(blob).hexdigest()[:12]}"


DIGITS_NPZ = "sklearn-digits.npz"
SPLIT_STREAM = {"train": 0, "val": 1, "test": 2}  # a split's random stream: its scenes do not depend on the others


def _load_digits(base: Path | None = None):
    """scikit-learn's digits as (images float32 (1797, 8, 8) in [0, 1], labels int64); without scikit-learn, from
    ``base/sources/sklearn-digits.npz`` (written by :func:`write_sources`, e.g. for an offline GPU machine)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        npz = (base or cache_root()) / "sources" / DIGITS_NPZ
        if not npz.is_file():
            raise ImportError(f"the digits dataset needs scikit-learn, or {npz} (write_sources)") from None
        with np.load(npz, allow_pickle=False) as z:
            return z["images"].astype(np.float32) / 16.0, z["target"].astype(np.int64)
    d = load_digits()
    return d.images.astype(np.float32) / 16.0, d.target.astype(np.int64)


def write_sources(base: str | Path) -> Path:
    """Write scikit-learn's digits (uint8 0-16, exactly as shipped) to ``base/sources/sklearn-digits.npz``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    out = Path(base) / "sources" / DIGITS_NPZ
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.npz")
    np.savez_compressed(tmp, images=d.images.astype(np.uint8), target=d.target.astype(np.int64))
    os.replace(tmp, out)
    return out


def _background(rng: np.random.Generator, s: int) -> np.ndarray:
    """Smooth random background: a base colour, a linear gradient and a few soft blobs (float32 HxWx3, 0-255)."""
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / s
    dark = rng.random() < 0.5
    base = rng.uniform(10, 90, 3) if dark else rng.uniform(150, 240, 3)
    g = rng.uniform(-40, 40, (2, 3))
    img = base + xx[..., None] * g[0] + yy[..., None] * g[1]
    for _ in range(rng.integers(0, 4)):
        cx, cy, r = rng.random(), rng.random(), rng.uniform(0.1, 0.4)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
        img = img + blob[..., None] * rng.uniform(-35, 35, 3)
    return img.astype(np.float32), dark


def _upscale(glyph: np.ndarray, w: int, h: int) -> np.ndarray:
    from PIL import Image

    im = Image.fromarray((glyph * 255).astype(np.uint8))
    return np.asarray(im.resize((w, h), Image.BILINEAR), dtype=np.float32) / 255.0


def _scene(rng, p, glyphs, targets, pool):
    s = p["imgsz"]
    img, dark = _background(rng, s)
    boxes = []  # (cls, x0, y0, x1, y1) in pixels, tight around the ink
    placed = []  # occupied rectangles, with a margin
    for _ in range(rng.integers(p["min_digits"], p["max_digits"] + 1)):
        idx = pool[rng.integers(len(pool))]
        side = rng.uniform(p["min_size"], p["max_size"]) * s
        w = max(8, int(round(side * rng.uniform(0.8, 1.1))))
        h = max(8, int(round(side * rng.uniform(0.95, 1.2))))
        w, h = min(w, s - 2), min(h, s - 2)
        for _attempt in range(30):
            x0, y0 = int(rng.integers(0, s - w + 1)), int(rng.integers(0, s - h + 1))
            if all(x0 >= b[2] or x0 + w <= b[0] or y0 >= b[3] or y0 + h <= b[1] for b in placed):
                break
        else:
            continue  # no room left for this digit
        alpha = _upscale(glyphs[idx], w, h)
        ink = alpha > 0.3
        if not ink.any():
            continue
        colour = rng.uniform(170, 255, 3) if dark else rng.uniform(0, 80, 3)
        region = img[y0 : y0 + h, x0 : x0 + w]
        img[y0 : y0 + h, x0 : x0 + w] = region * (1 - alpha[..., None]) + colour * alpha[..., None]
        ys, xs = np.nonzero(ink)
        boxes.append((int(targets[idx]), x0 + xs.min(), y0 + ys.min(), x0 + xs.max() + 1, y0 + ys.max() + 1))
        placed.append((x0 - 1, y0 - 1, x0 + w + 1, y0 + h + 1))
    img = img + rng.normal(0, p["noise"], img.shape).astype(np.float32)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), boxes


def _write_split(root: Path, split: str, n: int, rng, p, glyphs, targets, pool):
    from PIL import Image

    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "labels" / split).mkdir(parents=True, exist_ok=True)
    s = p["imgsz"]
    for i in range(n):
        img, boxes = _scene(rng, p, glyphs, targets, pool)
        stem = f"{split}_{i:05d}"
        Image.fromarray(img).save(root / "images" / split / f"{stem}.png")
        write_labels(root / "labels" / split / f"{stem}.txt", boxes, s)


def write_labels(path: Path, boxes, s: int) -> None:
    """YOLO label file of pixel boxes ``(class, x0, y0, x1, y1)`` in an ``s`` x ``s`` image."""
    lines = [f"{c} {(x0 + x1) / 2 / s:.6f} {(y0 + y1) / 2 / s:.6f} {(x1 - x0) / s:.6f} {(y1 - y0) / s:.6f}"
             for c, x0, y0, x1, y1 in boxes]
    path.write_text("\n".join(lines) + ("\n" if lines else ""))


def data_yaml_text(root: Path, p: dict, names, source: str = "yolo_bimamba.data from sklearn digits") -> str:
    """The Ultralytics data YAML of a generated dataset at ``root`` (train/val/test image folders, class names)."""
    lines = [
        f"# generated by {source}; parameters: {json.dumps(p, sort_keys=True)}",
        f"path: {json.dumps(str(root))}",
        "train: images/train",
        "val: images/val",
        *(["test: images/test"] if p.get("n_test") else []),
        f"nc: {len(names)}",
        "names:",
        *(f"  {i}: '{n}'" for i, n in enumerate(names)),
    ]
    return "\n".join(lines) + "\n"


def build_digits_dataset(root: str | Path | None = None, force: bool = False, **params) -> Path:
    """Build (or reuse from the cache) the digits scenes and return the path of their Ultralytics data YAML.

    Args:
        root: cache root (default :func:`cache_root`); the dataset goes into ``root/<name>-<hash of params>``.
        force: rebuild even if a complete cached copy exists.
        **params: overrides of :data:`DEFAULTS` (imgsz, n_train, n_val, min_digits, max_digits, min_size, max_size,
            noise, seed, name).
    """
    p = _params(**params)
    base = Path(root) if root is not None else cache_root()
    out = base / _key(p)
    yaml_path = out / "data.yaml"
    if yaml_path.is_file() and not force:
        return yaml_path

    glyphs, targets = _load_digits(base)
    # Disjoint handwriting for train and val: a fixed permutation, the first 25% of samples are reserved for val;
    # test scenes are other scenes of the same reserved samples.
    perm = np.random.default_rng(12345).permutation(len(targets))
    n_hold = len(perm) // 4
    pools = {"train": perm[n_hold:], "val": perm[:n_hold], "test": perm[:n_hold]}

    def write(tmp: Path):
        for split, n in splits(p):
            rng = np.random.default_rng([p["seed"], SPLIT_STREAM[split]])
            _write_split(tmp, split, n, rng, p, glyphs, targets, pools[split])
        (tmp / "data.yaml").write_text(data_yaml_text(out, p, NAMES))

    return build_cached(out, write, force)


def build_cached(out: Path, write, force: bool = False) -> Path:
    """Run ``write(tmp)`` into a fresh folder beside ``out`` and rename it to ``out`` (safe when several processes
    build the same dataset at once: the first rename wins). Returns ``out / "data.yaml"``."""
    yaml_path = out / "data.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))  # build aside, then rename
    try:
        write(tmp)
        if force and out.exists():
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first (target dir not empty): keep theirs
            if not yaml_path.is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return yaml_path


def dataset_spec(path: str | Path) -> dict | None:
    """Return the generator parameters if ``path`` is a yolo-bimamba dataset descriptor YAML, else None."""
    path = Path(path)
    if path.suffix not in {".yaml", ".yml"} or not path.is_file():
        return None
    try:
        if path.stat().st_size > 65536:
            return None
        text = path.read_text(errors="replace")
    except OSError:
        return None
    if GENERATOR_KEY not in text:
        return None
    import yaml

    spec = (yaml.safe_load(text) or {}).get(GENERATOR_KEY)
    if not isinstance(spec, dict):
        return None
    spec = dict(spec)
    spec.setdefault("generator", "digits")
    if spec["generator"] not in GENERATORS:
        raise ValueError(f"{path}: unknown dataset generator {spec['generator']!r}; known: {sorted(GENERATORS)}")
    return spec


#: generator name in a descriptor YAML -> "module:function" building that dataset (imported on use)
GENERATORS = {
    "digits": "yolo_bimamba.data:build_digits_dataset",
    "fashion": "yolo_bimamba.fashion_scenes:build_fashion_dataset",
}


def build_dataset(generator: str = "digits", root: str | Path | None = None, force: bool = False, **params) -> Path:
    """Build (or reuse from the cache) the dataset of ``generator`` (a key of :data:`GENERATORS`) and return the path
    of its Ultralytics data YAML."""
    import importlib

    if generator not in GENERATORS:
        raise ValueError(f"unknown dataset generator {generator!r}; known: {sorted(GENERATORS)}")
    mod, fn = GENERATORS[generator].split(":")
    return getattr(importlib.import_module(mod), fn)(root=root, force=force, **params)


def resolve_data_yaml(path: str | Path) -> str | None:
    """If ``path`` is a descriptor YAML, build the dataset it describes and return the generated data YAML path."""
    spec = dataset_spec(path)
    if spec is None:
        return None
    return str(build_dataset(**spec))


if __name__ == "__main__":  # python -m yolo_bimamba.data [key=value ...]: build and print the data YAML path
    import sys

    kv = dict(a.split("=", 1) for a in sys.argv[1:])
    print(build_digits_dataset(**{k: (v if k == "name" else float(v)) for k, v in kv.items()}))
