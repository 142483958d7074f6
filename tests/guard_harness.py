"""The harness of the guard tests (test_guard.py, test_guard_step.py): real Ultralytics training runs on CPU.


Setting: a tiny detector (tiny-bimamba.yaml below: 2 C2f, one C2fBiMamba = layer 4, a 2-level Detect head), 6 images
of 64 px with YOLO labels written to a temporary folder, batch 2 -> 3 batches per epoch, nbs=2 -> one optimizer step
per batch (accumulate=1) unless a test says otherwise, SGD, no warmup, no mosaic, val=False, plots=False.

Fault injection (documented here because Ultralytics fires no callback between backward and optimizer_step): a test
callback at ``on_train_batch_start`` of the chosen (epoch, batch) registers a ONE-SHOT hook that removes itself when
it fires:
  * "nan"/"inf" gradient: ``Tensor.register_hook`` on one parameter of our block (model.4.m.0.mixer.in_proj.weight);
    the hook returns the gradient with element 0 set to NaN/Inf, so autograd accumulates the poisoned gradient into
    ``param.grad`` during backward - before ``optimizer_step`` (the guard) sees it;
  * "fwd": a forward hook (prepend=True, so it runs before any other hook) on our block's layer model.4.m.0
    (BiMambaLayer2D) returns its output with one element set to NaN; the loss and every gradient upstream become NaN.
The test callbacks are added to the YOLO object, so they run before the guard's own callbacks.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from yolo_bimamba import guard
from yolo_bimamba import ultralytics_glue

REPO = Path(__file__).resolve().parents[1]
PARAM = "model.4.m.0.mixer.in_proj.weight"  # injected parameter (inside our C2fBiMamba block)
LAYER = "model.4.m.0"  # injected module (BiMambaLayer2D inside our C2fBiMamba block)

TINY_YAML = """\
nc: 2
backbone:
  - [-1, 1, Conv, [8, 3, 2]]
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, C2f, [16, True]]
  - [-1, 1, Conv, [32, 3, 2]]
  - [-1, 1, C2fBiMamba, [32, True, 1, 0.5, {d_state: 8, headdim: 8, chunk_size: 16}]]
  - [-1, 1, Conv, [32, 3, 2]]
  - [-1, 1, C2f, [32, True]]
head:
  - [[4, 6], 1, Detect, [nc]]
"""


# ----------------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Glue + guard installed, a 6-image dataset and the tiny model YAML."""
    ultralytics_glue.register()  # our blocks in parse_model, offline fonts; calls guard.install() itself
    guard.install()  # idempotent; explicit in case the glue does not
    from PIL import Image

    root = tmp_path_factory.mktemp("guard_ds")
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    (root / "labels").mkdir()
    for k in range(6):
        img = (rng.random((64, 64, 3)) * 60).astype(np.uint8)
        lines = []
        for _ in range(2):
            w, h = rng.integers(12, 30, 2)
            x0, y0 = rng.integers(0, 64 - 30, 2)
            c = int(rng.integers(0, 2))
            img[y0 : y0 + h, x0 : x0 + w] = [200, 50, 50] if c == 0 else [50, 50, 200]
            lines.append(f"{c} {(x0 + w / 2) / 64:.4f} {(y0 + h / 2) / 64:.4f} {w / 64:.4f} {h / 64:.4f}")
        Image.fromarray(img).save(root / "images" / f"im{k}.png")
        (root / "labels" / f"im{k}.txt").write_text("\n".join(lines) + "\n")
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images\nval: images\nnames:\n  0: red\n  1: blue\n")
    model = root / "tiny-bimamba.yaml"
    model.write_text(TINY_YAML)
    return SimpleNamespace(root=root, data=str(data), model=str(model))


BASE = dict(epochs=2, imgsz=64, batch=2, nbs=2, workers=0, plots=False, device="cpu", exist_ok=True, warmup_epochs=0,
            optimizer="SGD", lr0=0.01, mosaic=0.0, val=False, amp=False, verbose=False)


class Run:
    """Injection schedule + per-batch records of one training run."""

    def __init__(self, inject=(), interrupt_at_epoch=None, param=PARAM):
        self.inject = {(e, b): kind for e, b, kind in inject}
        self.param = param
        self.interrupt_at_epoch = interrupt_at_epoch
        self.batch = -1
        self.records = {}  # (epoch, batch) -> dict
        self.bn_before = {}
        self.trainer = None

    def attach(self, yolo):
        yolo.add_callback("on_train_epoch_start", self.on_epoch_start)
        yolo.add_callback("on_train_batch_start", self.on_batch_start)
        yolo.add_callback("on_train_batch_end", self.on_batch_end)
        return yolo

    def on_epoch_start(self, trainer):
        self.trainer = trainer
        self.batch = -1
        if self.interrupt_at_epoch is not None and trainer.epoch == self.interrupt_at_epoch:
            raise Interrupted(f"interrupted at the start of epoch {trainer.epoch}")

    def on_batch_start(self, trainer):
        self.batch += 1
        key = (trainer.epoch, self.batch)
        kind = self.inject.get(key)
        if kind is None:
            return
        model = trainer.model
        self.bn_before[key] = bn_buffers(model)
        if kind == "fwd":
            layer = dict(model.named_modules())[LAYER]

            def fwd(module, inputs, output):
                handle.remove()
                output = output.clone()
                output.view(-1)[0] = float("nan")
                return output

            handle = layer.register_forward_hook(fwd, prepend=True)
        else:
            param = dict(model.named_parameters())[self.param]
            value = float("nan") if kind == "nan" else float("inf")

            def grad(g):
                handle.remove()
                g = g.clone()
                g.view(-1)[0] = value
                return g

            handle = param.register_hook(grad)

    def on_batch_end(self, trainer):
        self.records[(trainer.epoch, self.batch)] = dict(
            model_finite=all_finite(trainer.model.state_dict()),
            ema_finite=all_finite(trainer.ema.ema.state_dict()),
            bn=bn_buffers(trainer.model),
        )


class Interrupted(Exception):
    pass


def all_finite(sd):
    return all(bool(torch.isfinite(v).all()) for v in sd.values() if v.is_floating_point())


def bn_buffers(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}


def train(env, name, run=None, model=None, **kw):
    from ultralytics import YOLO

    yolo = YOLO(model or env.model)
    run = run or Run()
    run.attach(yolo)
    args = {**BASE, "data": env.data, "project": str(env.root / "runs"), "name": name, **kw}
    yolo.train(**args)
    return yolo.trainer, run


def init_state(env):
    from ultralytics import YOLO

    return YOLO(env.model).model.state_dict()


def read_csv(trainer):
    with open(trainer.csv) as f:
        return [{k.strip(): v.strip() for k, v in row.items()} for row in csv.DictReader(f)]


def ckpt_tensors(obj, prefix=""):
    """Every tensor in a checkpoint: module state_dicts, optimizer state, anything nested."""
    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, torch.nn.Module):
        yield from ckpt_tensors(obj.state_dict(), prefix)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from ckpt_tensors(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from ckpt_tensors(v, f"{prefix}.{i}")


def check_clean_checkpoint(path, init_sd):
    ck = torch.load(path, map_location="cpu", weights_only=False)
    tensors = list(ckpt_tensors({k: v for k, v in ck.items() if k in ("ema", "model", "optimizer", "scaler")}))
    assert len(tensors) > 50
    bad = [k for k, v in tensors if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    assert bad == [], f"{path.name}: non-finite tensors {bad[:5]}"
    net = ck["ema"] if ck.get("ema") is not None else ck["model"]
    sd = net.float().state_dict()
    zeroed = [k for k, v in sd.items() if v.is_floating_point() and not bool(v.any()) and bool(init_sd[k].any())]
    assert zeroed == [], f"{path.name}: tensors zeroed although non-zero at init: {zeroed[:5]}"
    return ck
