"""A harder development dataset: cluttered scenes of real product photos (Fashion-MNIST), in YOLO detection format.

Objects are the 70,000 grey-scale product photos of Zalando's Fashion-MNIST (10 classes), read from the files of
Debian's ``dataset-fashion-mnist`` package (``apt-get install dataset-fashion-mnist``: /usr/share/datasets/
fashion-mnist/*-ubyte.gz) or from the folder ``$YOLO_BIMAMBA_FASHION_MNIST``. Nothing is downloaded.

Every scene (default 320 px, JPEG) gets a cluttered background - multi-scale noise texture, stripes or checks, a
colour gradient, and distractor patches (textured rectangles and ellipses, strokes) -, then 2-8 tinted product
photos with log-uniform sizes from 8 % to 60 % of the image side (one in seven is wider than 45 %, covering about a
third of the image or more), which may overlap each other, and opaque occluder patches on top. A new object or
occluder is only placed where every object already there keeps at least ``1 - max_occlusion`` of its pixels visible,
so every labelled object is at least half visible; each box is tight around the object's visible pixels. Pixel noise
and JPEG compression last. Train scenes draw from the first 15,000 of Fashion-MNIST's 60,000 training photos, val
scenes from the first 5,000 of its 10,000 test photos: validation sees unseen products. Each scene has its own random
generator (seed, split, index), so the scenes are the same however many processes write them. Cached like the digits
set (:mod:`yolo_bimamba.data`), keyed by the parameters. Without the Debian package, the photo pools are read from
``<cache root>/sources/`` (:func:`write_sources`: an 8 MB file), which is how an offline machine builds the same scenes.

Descriptor YAML: ``cfg/fashion.yaml`` (``generator: fashion``); ``data=fashion.yaml`` builds it on first use.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from . import config
from .data import SPLIT_STREAM, _key, build_cached, cache_root, check_split_sizes, data_yaml_text, merged_params, \
    splits, write_labels

__all__ = ["DEFAULTS", "NAMES", "build_fashion_dataset", "load_fashion_mnist", "source_dir", "write_sources"]

VERSION = 1  # bump when the scene recipe changes: it is part of the cache key
NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
INSTALL_HINT = ("Fashion-MNIST not found: install Debian's package (apt-get install dataset-fashion-mnist) or point "
                "$YOLO_BIMAMBA_FASHION_MNIST at a folder holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz")

DEFAULTS = {
    "name": "fashion",
    "imgsz": 320,  # square scene size in pixels
    "n_train": 1200,
    "n_val": 300,
    "n_test": 0,  # test scenes: drawn afresh from val's photos (none of train's); 0: no test split
    "min_objects": 2,
    "max_objects": 8,
    "min_size": 0.08,  # object box side as a fraction of imgsz (log-uniform between the two)
    "max_size": 0.60,
    "max_occlusion": 0.5,  # largest hidden fraction of any object's pixels
    "distractors": 6,  # up to this many background distractor patches
    "occluders": 2,  # up to this many opaque patches placed over the objects
    "noise": 5.0,  # std of the additive pixel noise (0-255 scale)
    "quality": 88,  # JPEG quality
    "pool_train": 15000,  # train scenes draw from the first pool_train of the 60,000 training photos
    "pool_val": 5000,  # val scenes from the first pool_val of the 10,000 test photos
    "seed": 0,
}
_INT_KEYS = ("imgsz", "n_train", "n_val", "n_test", "min_objects", "max_objects", "distractors", "occluders", "quality",
             "pool_train", "pool_val", "seed")
SOURCE_NPZ = "fashion-mnist-pools-{pool_train}-{pool_val}.npz"


def source_dir() -> Path:
    """Folder holding the Fashion-MNIST idx files ($YOLO_BIMAMBA_FASHION_MNIST, else Debian's install folder)."""
    return Path(config.fashion_mnist_dir())


def _read_idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    if magic >> 8 != 0x08:  # unsigned byte data
        raise ValueError(f"{path}: not an idx file of unsigned bytes (magic {magic:#x})")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: expected {dims} values, found {arr.size}")
    return arr.reshape(dims)


def load_fashion_mnist(split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (n, 28, 28), labels int64 (n,)) of split 'train' (60,000) or 'test' (10,000)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    prefix = "train" if split == "train" else "t10k"
    d = source_dir()
    img_path, lab_path = d / f"{prefix}-images-idx3-ubyte.gz", d / f"{prefix}-labels-idx1-ubyte.gz"
    if not img_path.is_file() or not lab_path.is_file():
        raise FileNotFoundError(f"{INSTALL_HINT} (looked in {d})")
    images, labels = _read_idx(img_path), _read_idx(lab_path).astype(np.int64)
    if images.ndim != 3 or images.shape[0] != labels.shape[0]:
        raise ValueError(f"{d}: {prefix} images {images.shape} and labels {labels.shape} do not match")
    return images, labels


def _pools(p: dict, base: Path) -> dict:
    """{"train": (photos, labels), "val": (photos, labels)}: the photo pools the scenes draw from, read from the
    Fashion-MNIST idx files when they are installed, else from ``base/sources/`` (written by :func:`write_sources`,
    so that a machine without the Debian package, e.g. an offline GPU machine, builds the same scenes)."""
    npz = base / "sources" / SOURCE_NPZ.format(**p)
    d = source_dir()
    if not (d / "train-images-idx3-ubyte.gz").is_file() and npz.is_file():
        with np.load(npz, allow_pickle=False) as z:
            return {"train": (z["train_x"], z["train_y"]), "val": (z["val_x"], z["val_y"])}
    (tx, ty), (vx, vy) = load_fashion_mnist("train"), load_fashion_mnist("test")
    return {"train": (tx[: p["pool_train"]], ty[: p["pool_train"]]), "val": (vx[: p["pool_val"]], vy[: p["pool_val"]])}


def write_sources(base: str | Path, **params) -> Path:
    """Write the photo pools of the dataset with ``params`` to ``base/sources/`` (compressed npz) and return it."""
    p = _params(**params)
    pools = _pools(p, Path(base))
    out = Path(base) / "sources" / SOURCE_NPZ.format(**p)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.npz")
    np.savez_compressed(tmp, train_x=pools["train"][0], train_y=pools["train"][1], val_x=pools["val"][0],
                        val_y=pools["val"][1])
    os.replace(tmp, out)
    return out


def _params(**overrides) -> dict:
    p = merged_params("fashion dataset", DEFAULTS, overrides)
    for k in _INT_KEYS:
        p[k] = int(p[k])
    for k in ("min_size", "max_size", "max_occlusion", "noise"):
        p[k] = float(p[k])
    if p["imgsz"] < 64:
        raise ValueError(f"imgsz must be >= 64, got {p['imgsz']}")
    check_split_sizes(p)
    if not 1 <= p["min_objects"] <= p["max_objects"]:
        raise ValueError("need 1 <= min_objects <= max_objects")
    if not 0 < p["min_size"] <= p["max_size"] <= 0.9:
        raise ValueError("need 0 < min_size <= max_size <= 0.9")
    if not 0 <= p["max_occlusion"] < 1:
        raise ValueError("need 0 <= max_occlusion < 1")
    if not 1 <= p["pool_train"] <= 60000 or not 1 <= p["pool_val"] <= 10000:
        raise ValueError("need 1 <= pool_train <= 60000 and 1 <= pool_val <= 10000")
    if not 1 <= p["quality"] <= 100:
        raise ValueError("quality (JPEG) must be in 1..100")
    return p


# ------------------------------------------------------------------------------------------------ scene parts
def _resize(a: np.ndarray, w: int, h: int) -> np.ndarray:
    """Bilinear resize of a float32 2-D array."""
    from PIL import Image

    return np.asarray(Image.fromarray(a.astype(np.float32), mode="F").resize((w, h), Image.BILINEAR), np.float32)


def _noise_texture(rng, s: int) -> np.ndarray:
    """Multi-scale value noise in about [-1, 1], (s, s)."""
    t = np.zeros((s, s), np.float32)
    amp = 1.0
    for cells in (4, 8, 16, 48):
        t += amp * _resize(rng.uniform(-1, 1, (cells, cells)).astype(np.float32), s, s)
        amp *= 0.6
    return t / 2.2


def _background(rng, s: int) -> np.ndarray:
    yy, xx = np.mgrid[0:s, 0:s].astype(np.float32) / s
    base = rng.uniform(30, 220, 3)
    img = base + xx[..., None] * rng.uniform(-60, 60, 3) + yy[..., None] * rng.uniform(-60, 60, 3)
    kind = rng.integers(3)
    if kind == 0:  # coloured noise texture
        img = img + _noise_texture(rng, s)[..., None] * rng.uniform(20, 70, 3)
    elif kind == 1:  # stripes at a random angle and period
        ang, period = rng.uniform(0, np.pi), rng.uniform(6, 40) / s
        wave = np.sin(2 * np.pi * (xx * np.cos(ang) + yy * np.sin(ang)) / period)
        img = img + (wave > 0)[..., None] * rng.uniform(-60, 60, 3)
    else:  # checks
        cell = rng.uniform(8, 48) / s
        chk = (np.floor(xx / cell) + np.floor(yy / cell)) % 2
        img = img + chk[..., None] * rng.uniform(-50, 50, 3) + _noise_texture(rng, s)[..., None] * 15
    return img.astype(np.float32)


def _shape_mask(rng, s: int, w: int, h: int, x0: int, y0: int) -> np.ndarray:
    """Boolean (s, s) mask of a rectangle or an ellipse with corner (x0, y0) and size (w, h)."""
    m = np.zeros((s, s), bool)
    if rng.random() < 0.5:
        m[y0:y0 + h, x0:x0 + w] = True
    else:
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        m[y0:y0 + h, x0:x0 + w] = ((xx + 0.5 - w / 2) / (w / 2)) ** 2 + ((yy + 0.5 - h / 2) / (h / 2)) ** 2 <= 1
    return m


def _patch_colour(rng, s: int) -> np.ndarray:
    """A textured colour field (s, s, 3) for distractor and occluder patches."""
    return rng.uniform(0, 255, 3) + _noise_texture(rng, s)[..., None] * rng.uniform(10, 60, 3)


def _distractors(rng, img: np.ndarray, p: dict):
    s = p["imgsz"]
    for _ in range(rng.integers(0, p["distractors"] + 1)):
        w, h = (int(v) for v in rng.uniform(0.05, 0.35, 2) * s)
        x0, y0 = int(rng.integers(0, s - w)), int(rng.integers(0, s - h))
        m = _shape_mask(rng, s, max(w, 2), max(h, 2), x0, y0)
        a = rng.uniform(0.5, 1.0)
        img[m] = img[m] * (1 - a) + _patch_colour(rng, s)[m] * a
    for _ in range(rng.integers(0, 4)):  # strokes: thick random lines
        x = np.linspace(rng.uniform(0, s), rng.uniform(0, s), 4 * s)
        y = np.linspace(rng.uniform(0, s), rng.uniform(0, s), 4 * s)
        r = int(rng.integers(1, 4))
        c = rng.uniform(0, 255, 3)
        for dx in range(-r, r + 1):
            xi, yi = np.clip((x + dx).astype(int), 0, s - 1), np.clip(y.astype(int), 0, s - 1)
            img[yi, xi] = c


def _fits(owner: np.ndarray, cover: np.ndarray, areas: list, keep: float) -> bool:
    """Whether covering ``cover`` leaves every object j at least keep * areas[j] visible pixels."""
    hit = owner[cover]
    if hit.size == 0:
        return True
    hit = hit[hit >= 0]
    if hit.size == 0:
        return True
    lost = np.bincount(hit, minlength=len(areas))
    visible = np.bincount(owner[owner >= 0], minlength=len(areas))
    return all(visible[j] - lost[j] >= keep * areas[j] for j in range(len(areas)))


def _scene(rng, p: dict, photos: np.ndarray, labels: np.ndarray):
    s = p["imgsz"]
    img = _background(rng, s)
    _distractors(rng, img, p)
    owner = np.full((s, s), -1, np.int64)  # index of the object a pixel shows, -1: none
    classes, areas = [], []
    keep = 1.0 - p["max_occlusion"]
    lo, hi = np.log(p["min_size"]), np.log(p["max_size"])
    for _ in range(rng.integers(p["min_objects"], p["max_objects"] + 1)):
        k = int(rng.integers(len(photos)))
        side = float(np.exp(rng.uniform(lo, hi))) * s
        w = min(s - 2, max(10, int(round(side * rng.uniform(0.85, 1.15)))))
        h = min(s - 2, max(10, int(round(side * rng.uniform(0.85, 1.15)))))
        alpha = np.clip(_resize(photos[k].astype(np.float32) / 255.0, w, h) * 4.0, 0, 1)
        for _attempt in range(20):
            x0, y0 = int(rng.integers(0, s - w + 1)), int(rng.integers(0, s - h + 1))
            cover = np.zeros((s, s), bool)
            cover[y0:y0 + h, x0:x0 + w] = alpha > 0.5
            if cover.sum() >= 30 and _fits(owner, cover, areas, keep):
                break
        else:
            continue  # no place where every object stays visible enough
        shade = _resize(photos[k].astype(np.float32) / 255.0, w, h)
        colour = rng.uniform(20, 255, 3) * rng.uniform(0.5, 1.0)
        obj = colour * (0.3 + 0.7 * shade[..., None])
        region = img[y0:y0 + h, x0:x0 + w]
        img[y0:y0 + h, x0:x0 + w] = region * (1 - alpha[..., None]) + obj * alpha[..., None]
        owner[cover] = len(areas)
        areas.append(int(cover.sum()))
        classes.append(int(labels[k]))
    for _ in range(rng.integers(0, p["occluders"] + 1)):  # opaque patches over the objects
        for _attempt in range(10):
            w, h = (int(v) for v in rng.uniform(0.06, 0.25, 2) * s)
            x0, y0 = int(rng.integers(0, s - w)), int(rng.integers(0, s - h))
            m = _shape_mask(rng, s, max(w, 2), max(h, 2), x0, y0)
            if _fits(owner, m, areas, keep):
                img[m] = _patch_colour(rng, s)[m]
                owner[m] = -1
                break
    boxes = []
    for j, c in enumerate(classes):
        ys, xs = np.nonzero(owner == j)
        if ys.size:
            boxes.append((c, int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1))
    img = img + rng.normal(0, p["noise"], img.shape).astype(np.float32)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), boxes


def _write_scenes(root: Path, split: str, idx: range, p: dict, photos, labels):
    """Write scenes ``idx`` of ``split``; scene i draws from its own generator (seed, split, i), so any subset of
    scenes can be written by any process and the result does not depend on how the work was divided."""
    from PIL import Image

    s, off = p["imgsz"], SPLIT_STREAM[split]
    for i in idx:
        img, boxes = _scene(np.random.default_rng([p["seed"], off, i]), p, photos, labels)
        stem = f"{split}_{i:05d}"
        Image.fromarray(img).save(root / "images" / split / f"{stem}.jpg", quality=p["quality"])
        write_labels(root / "labels" / split / f"{stem}.txt", boxes, s)


def _write_split(root: Path, split: str, n: int, p: dict, photos, labels, workers: int):
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "labels" / split).mkdir(parents=True, exist_ok=True)
    workers = max(1, min(workers, n // 50))
    if workers == 1:
        _write_scenes(root, split, range(n), p, photos, labels)
        return
    import multiprocessing as mp

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers) as pool:
        pool.starmap(_write_scenes, [(root, split, range(k, n, workers), p, photos, labels) for k in range(workers)])


def build_fashion_dataset(root: str | Path | None = None, force: bool = False, workers: int | None = None,
                          **params) -> Path:
    """Build (or reuse from the cache) the Fashion-MNIST scenes and return the path of their Ultralytics data YAML.

    Args:
        root: cache root (default :func:`yolo_bimamba.data.cache_root`); the dataset goes into
            ``root/<name>-<hash of params>``.
        force: rebuild even if a complete cached copy exists.
        workers: processes writing scenes (default: up to 8, one per CPU core); the scenes do not depend on it.
        **params: overrides of :data:`DEFAULTS`.
    """
    p = _params(**params)
    base = Path(root) if root is not None else cache_root()
    out = base / _key(p, VERSION)
    yaml_path = out / "data.yaml"
    if yaml_path.is_file() and not force:
        return yaml_path
    sources = _pools(p, base)
    workers = min(8, os.cpu_count() or 1) if workers is None else int(workers)

    def write(tmp: Path):
        for split, n in splits(p):
            _write_split(tmp, split, n, p, *sources["train" if split == "train" else "val"], workers)
        (tmp / "data.yaml").write_text(data_yaml_text(out, p, NAMES, "yolo_bimamba.fashion_scenes from Fashion-MNIST"))

    return build_cached(out, write, force)
