"""Tests of the non-finite step guard (yolo_bimamba/guard.py) with real Ultralytics training runs on CPU.

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
import math
import os
import subprocess
import sys
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


# -------------------------------------------------------------------------------------------------------- cfg keys
def test_config_keys_typed_and_validated(env, tmp_path):
    from ultralytics.cfg import get_cfg
    from ultralytics.utils import DEFAULT_CFG, DEFAULT_CFG_DICT, YAML

    for k, v in guard.GUARD_DEFAULTS.items():
        assert DEFAULT_CFG_DICT[k] == v and getattr(DEFAULT_CFG, k) == v
    cfg = get_cfg(DEFAULT_CFG, {"nan_guard": False, "clip_max_norm": 5, "nan_guard_max_skips": 20, "nan_debug": True})
    assert (cfg.nan_guard, cfg.clip_max_norm, cfg.nan_guard_max_skips, cfg.nan_debug) == (False, 5, 20, True)
    with pytest.raises(TypeError):
        get_cfg(DEFAULT_CFG, {"nan_guard": "maybe"})
    with pytest.raises(TypeError):
        get_cfg(DEFAULT_CFG, {"nan_guard_max_skips": 2.5})
    with pytest.raises(TypeError):
        get_cfg(DEFAULT_CFG, {"clip_max_norm": "big"})
    with pytest.raises(SyntaxError):  # unknown keys are still rejected
        get_cfg(DEFAULT_CFG, {"nan_gaurd": True})
    # a cfg YAML as `yolo cfg=...` / model.train(cfg=...) reads it
    f = tmp_path / "c.yaml"
    f.write_text("nan_guard: false\nclip_max_norm: 2.5\nnan_guard_max_skips: 7\nnan_debug: true\n")
    cfg = get_cfg(DEFAULT_CFG, YAML.load(f))
    assert (cfg.nan_guard, cfg.clip_max_norm, cfg.nan_guard_max_skips, cfg.nan_debug) == (False, 2.5, 7, True)
    guard.install()  # idempotent
    from ultralytics.engine.trainer import BaseTrainer

    assert BaseTrainer.optimizer_step.__wrapped__.__name__ == "optimizer_step"
    assert not getattr(BaseTrainer.optimizer_step.__wrapped__, "_yolo_bimamba_guard", False)
    from ultralytics.models.yolo.detect import DetectionTrainer

    for key, bad in (("clip_max_norm", -1.0), ("nan_guard_max_skips", -1), ("clip_max_norm", float("nan"))):
        with pytest.raises(ValueError, match=key):  # Ultralytics' check_cfg (8.4: CFG_INT_MIN) or the guard's
            DetectionTrainer(overrides={**BASE, "model": env.model, "data": env.data, key: bad,
                                        "project": str(tmp_path), "name": "neg"})


def test_cli_keys_and_clip_spy_guard_off(env, monkeypatch):
    """`yolo train ... nan_guard=False clip_max_norm=5.0 nan_guard_max_skips=20 nan_debug=True` through Ultralytics'
    own CLI entrypoint; with the guard off the clip still uses clip_max_norm (spied on clip_grad_norm_)."""
    from ultralytics.cfg import entrypoint
    from ultralytics.utils import YAML

    seen = []
    orig = torch.nn.utils.clip_grad_norm_

    def spy(parameters, max_norm, *a, **k):
        seen.append(max_norm)
        return orig(parameters, max_norm, *a, **k)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    project = env.root / "runs"
    entrypoint(f"yolo train model={env.model} data={env.data} epochs=1 imgsz=64 batch=2 nbs=2 workers=0 plots=False "
               f"device=cpu project={project} name=cli exist_ok=True warmup_epochs=0 mosaic=0.0 val=False amp=False "
               f"nan_guard=False clip_max_norm=5.0 nan_guard_max_skips=20 nan_debug=True")
    args = YAML.load(project / "cli" / "args.yaml")
    assert args["nan_guard"] is False and args["nan_debug"] is True
    assert args["clip_max_norm"] == 5.0 and isinstance(args["clip_max_norm"], float)
    assert args["nan_guard_max_skips"] == 20 and isinstance(args["nan_guard_max_skips"], int)
    assert seen == [5.0] * 3  # 3 batches, one step each
    with open(project / "cli" / "results.csv") as f:
        header = f.readline()
    assert guard.CSV_SKIPPED not in header  # guard off: Ultralytics' columns only


# --------------------------------------------------------------------------------------------- fault injection, on
def test_nan_grad_and_forward_nan_then_resume(env):
    """NaN gradient in epoch 1, NaN forward output of our block in epoch 2, interrupted; resumed run gets a NaN
    gradient in epoch 3. Everything stays finite, counts are right, checkpoints are clean, resume continues."""
    init_sd = init_state(env)
    run = Run(inject=[(0, 1, "nan"), (1, 1, "fwd")], interrupt_at_epoch=2)
    with pytest.raises(Interrupted):
        train(env, "nanfwd", run, epochs=3)
    tr = run.trainer
    assert all(r["model_finite"] and r["ema_finite"] for r in run.records.values()), run.records
    assert len(run.records) == 6
    for key in run.inject:  # BatchNorm statistics were restored to their values before the bad batch
        after = run.records[key]["bn"]
        assert all(torch.equal(run.bn_before[key][k], after[k]) for k in after), key
    assert tr.guard.skipped == 2 and tr.guard.steps == 6 and tr.guard.amp_skipped == 0
    rows = read_csv(tr)
    assert [(r["guard/skipped"], r["guard/skipped_total"]) for r in rows] == [("1", "1"), ("1", "2")]
    assert all(math.isfinite(float(r["train/box_loss"])) for r in rows)  # the NaN batch is left out of the mean
    last = check_clean_checkpoint(tr.last, init_sd)
    assert last["epoch"] == 1 and last["optimizer"] is not None
    check_clean_checkpoint(tr.best, init_sd)

    # resume from last.pt: continues with epoch 3 and keeps counting
    from ultralytics import YOLO

    run2 = Run(inject=[(2, 0, "nan")])
    yolo = run2.attach(YOLO(str(tr.last)))
    yolo.train(resume=True, nan_debug=True)  # the guard's switches may change on resume
    tr2 = yolo.trainer
    # nan_guard unset (None): on, since the model holds our block
    assert tr2.start_epoch == 2 and tr2.args.nan_guard is None and guard.enabled(tr2) and tr2.args.nan_debug is True
    assert tr2.guard.debug_backward == f"parameter '{PARAM}'"
    assert sorted(run2.records) == [(2, 0), (2, 1), (2, 2)]
    assert all(r["model_finite"] and r["ema_finite"] for r in run2.records.values())
    assert tr2.guard.skipped == 3 and tr2.guard.skipped_epoch == 1
    rows = read_csv(tr2)
    assert [(r["epoch"], r["guard/skipped"], r["guard/skipped_total"]) for r in rows] == [
        ("1", "1", "1"), ("2", "1", "2"), ("3", "1", "3")]
    assert all_finite(tr2.model.state_dict()) and all_finite(tr2.ema.ema.state_dict())
    check_clean_checkpoint(tr2.last, init_sd)
    check_clean_checkpoint(tr2.best, init_sd)


def test_inf_grad_first_and_last_batch_with_cfg_yaml_and_clip_spy(env, tmp_path, monkeypatch):
    """Inf gradient in epoch 1 and in the LAST batch of epoch 2 (keys from a cfg YAML); clipping with the guard on
    uses clip_max_norm, once per applied step."""
    init_sd = init_state(env)
    seen = []
    orig = torch.nn.utils.clip_grads_with_norm_

    def spy(parameters, max_norm, total_norm, *a, **k):
        seen.append(max_norm)
        return orig(parameters, max_norm, total_norm, *a, **k)

    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_", spy)
    cfg = tmp_path / "guard.yaml"
    cfg.write_text("nan_guard: true\nclip_max_norm: 5.0\nnan_guard_max_skips: 3\n")
    run = Run(inject=[(0, 0, "inf"), (1, 2, "inf")])
    tr, run = train(env, "inf", run, cfg=str(cfg))
    assert tr.args.clip_max_norm == 5.0 and tr.args.nan_guard_max_skips == 3
    assert all(r["model_finite"] and r["ema_finite"] for r in run.records.values())
    assert tr.guard.skipped == 2 and tr.guard.steps == 6
    assert seen == [5.0] * 4
    rows = read_csv(tr)
    assert [(r["guard/skipped"], r["guard/skipped_total"]) for r in rows] == [("1", "1"), ("1", "2")]
    assert tr.guard.consecutive == 1 and tr.guard.first_bad_param == tr.guard.last_bad_param == PARAM  # last batch
    check_clean_checkpoint(tr.last, init_sd)
    check_clean_checkpoint(tr.best, init_sd)


def test_gradient_accumulation_restores_bn_from_window_start(env):
    """accumulate=2 (nbs=4, batch=2): a NaN forward in the FIRST batch of a window is only seen at the window's step
    (second batch); BatchNorm statistics return to their values before the first batch."""
    run = Run(inject=[(0, 0, "fwd")])
    tr, run = train(env, "accum", run, nbs=4)
    assert tr.accumulate == 2
    assert tr.guard.steps == 3 and tr.guard.skipped == 1  # steps after batches 2, 4, 6 of 6
    before, after = run.bn_before[(0, 0)], run.records[(0, 1)]["bn"]
    assert all(torch.equal(before[k], after[k]) for k in after)
    assert not run.records[(0, 0)]["model_finite"]  # mid-window: the bad batch's BN update is still there...
    assert all(run.records[k]["model_finite"] and run.records[k]["ema_finite"] for k in run.records if k != (0, 0))


# -------------------------------------------------------------------------------------------- fault injection, off
@pytest.mark.parametrize("kind", ["nan", "inf", "fwd"])
def test_guard_off_same_injection_poisons_the_run(env, kind):
    """The opposite: nan_guard=False is Ultralytics as is - one bad gradient makes weights and EMA non-finite, and
    the epoch-1 checkpoint gets tensors silently zeroed by Ultralytics' nan_to_num_."""
    init_sd = init_state(env)
    run = Run(inject=[(0, 1, kind)])
    tr, run = train(env, f"off_{kind}", run, epochs=1, nan_guard=False)
    assert run.records[(0, 0)]["model_finite"] and run.records[(0, 0)]["ema_finite"]
    assert not run.records[(0, 1)]["model_finite"] and not run.records[(0, 1)]["ema_finite"]
    assert not run.records[(0, 2)]["model_finite"] and not run.records[(0, 2)]["ema_finite"]
    assert not all_finite(tr.model.state_dict())
    assert "guard" not in tr.__dict__ or tr.guard.steps == 0
    ck = torch.load(tr.last, map_location="cpu", weights_only=False)
    sd = (ck["ema"] if ck.get("ema") is not None else ck["model"]).float().state_dict()
    # 8.4 zeroes the NaN tensors with nan_to_num_ before saving; 8.3 saves them as they are
    bad = [k for k, v in sd.items() if v.is_floating_point() and (not bool(torch.isfinite(v).all()) or (
        not bool(v.any()) and bool(init_sd[k].any())))]
    assert len(bad) > 20


def test_guard_off_and_fault_free_guard_match_ultralytics_exactly(env):
    """Bit-identical weights: original Ultralytics (guard uninstalled) == nan_guard=False == guard on without
    faults (the guarded step uses the same clipping arithmetic)."""
    from ultralytics.engine.trainer import BaseTrainer

    guard.uninstall()
    try:
        assert not getattr(BaseTrainer.optimizer_step, "_yolo_bimamba_guard", False)
        ref, _ = train(env, "exact_ref", epochs=1)
        assert "guard" not in ref.__dict__
    finally:
        guard.install()
    off, _ = train(env, "exact_off", epochs=1, nan_guard=False)
    on, _ = train(env, "exact_on", epochs=1)
    assert on.guard.steps == 3 and on.guard.skipped == 0
    ref_sd = ref.model.state_dict()
    for other in (off, on):
        sd = other.model.state_dict()
        assert all(torch.equal(ref_sd[k], sd[k]) for k in ref_sd)
        esd, rsd = other.ema.ema.state_dict(), ref.ema.ema.state_dict()
        assert all(torch.equal(rsd[k], esd[k]) for k in rsd)


STOCK_PARAM = "model.4.cv1.conv.weight"  # the same layer index as our block in TINY_YAML, here a stock C2f


def _stock_model(env):
    path = env.root / "tiny-stock.yaml"
    path.write_text(TINY_YAML.replace("C2fBiMamba, [32, True, 1, 0.5, {d_state: 8, headdim: 8, chunk_size: 16}]",
                                      "C2f, [32, True]"))
    return str(path)


def _saved_args(trainer):
    from ultralytics.utils import YAML

    ck = torch.load(trainer.last, map_location="cpu", weights_only=False)
    return YAML.load(Path(trainer.save_dir) / "args.yaml"), ck["train_args"]


def test_stock_model_without_nan_guard_trains_exactly_as_ultralytics(env):
    """A model without our blocks and nan_guard unset: the same weights, EMA, results.csv columns and args.yaml keys
    as Ultralytics with the guard uninstalled; the guard takes no step. (The final, stripped last.pt lists every
    registered default key, so there the guard's keys appear at their defaults: Ultralytics' strip_optimizer fills
    them from DEFAULT_CFG_DICT, and its loaders ignore them.)"""
    from ultralytics.engine.trainer import BaseTrainer

    stock = _stock_model(env)
    guard.uninstall()
    try:
        assert not getattr(BaseTrainer.optimizer_step, "_yolo_bimamba_guard", False)
        ref, _ = train(env, "stock_ref", model=stock, epochs=1)
    finally:
        guard.install()
    assert getattr(BaseTrainer.optimizer_step, "_yolo_bimamba_guard", False)
    tr, _ = train(env, "stock_default", model=stock, epochs=1)
    assert not guard.enabled(tr) and tr.guard.steps == 0 and tr.guard.skipped == 0
    assert all(k not in vars(tr.args) for k in guard.GUARD_DEFAULTS)
    for a, b in ((ref.model.state_dict(), tr.model.state_dict()), (ref.ema.ema.state_dict(), tr.ema.ema.state_dict())):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert list(read_csv(ref)[0]) == list(read_csv(tr)[0])  # no guard columns
    (ref_yaml, ref_ck), (yaml_args, ck_args) = _saved_args(ref), _saved_args(tr)
    assert set(yaml_args) == set(ref_yaml) and not set(guard.GUARD_DEFAULTS) & set(yaml_args)
    assert {k: v for k, v in ck_args.items() if k not in ref_ck} == guard.GUARD_DEFAULTS


def test_stock_model_with_nan_guard_true_and_ours_by_default_are_guarded(env):
    """nan_guard=True opts a stock model in; a model with our blocks is guarded with nan_guard unset. A NaN gradient
    is skipped in both, weights and EMA stay finite, results.csv has the guard's columns."""
    run = Run(inject=[(0, 1, "nan")], param=STOCK_PARAM)
    tr, run = train(env, "stock_on", run, model=_stock_model(env), epochs=1, nan_guard=True)
    assert tr.args.nan_guard is True and guard.enabled(tr)
    ours, run_ours = train(env, "ours_default", Run(inject=[(0, 1, "nan")]), epochs=1)
    assert ours.args.nan_guard is None and guard.enabled(ours) and guard.has_our_modules(ours.model)
    for t, r in ((tr, run), (ours, run_ours)):
        assert t.guard.steps == 3 and t.guard.skipped == 1
        assert all(x["model_finite"] and x["ema_finite"] for x in r.records.values())
        assert guard.CSV_SKIPPED in read_csv(t)[0]


# ---------------------------------------------------------------------------------------------- max skips, debug
def test_max_consecutive_skips_raises_naming_the_parameter(env):
    run = Run(inject=[(0, 0, "nan"), (0, 1, "nan"), (0, 2, "nan")])
    with pytest.raises(RuntimeError) as e:
        train(env, "maxskip", run, nan_guard_max_skips=2)
    msg = str(e.value)
    assert "2 consecutive" in msg and f"'{PARAM}'" in msg and "nan_guard_max_skips=2" in msg
    assert run.trainer.guard.skipped == 2 and run.trainer.guard.consecutive == 2
    assert all(r["model_finite"] and r["ema_finite"] for r in run.records.values() if r)
    assert not run.trainer.last.exists()  # stopped in epoch 1 before any checkpoint


def test_nan_debug_names_module_and_parameter(env):
    """Also: a NaN forward in the LAST batch of a later epoch leaves the epoch's last loss NaN; Ultralytics would
    reload last.pt and redo the epoch (here the injection would repeat until it gives up after 3 attempts), but
    the guard already handled that step, so there is no reload."""
    run = Run(inject=[(0, 1, "nan"), (1, 2, "fwd")])
    tr, run = train(env, "debug", run, nan_debug=True)
    assert tr.guard.debug_backward == f"parameter '{PARAM}'"  # epoch 1: the injected gradient
    assert tr.guard.debug_forward == LAYER  # epoch 2: the NaN output of our block's layer
    assert tr.guard.skipped == 2 and tr.nan_recovery_attempts == 0 and not bool(torch.isfinite(tr.loss))
    assert all(r["model_finite"] and r["ema_finite"] for r in run.records.values())
    assert tr.guard.hooks == []  # removed at the end of training
    assert all(not m._forward_hooks for m in tr.model.modules())


def test_poisoned_ema_is_never_saved(env):
    """Second line of defence: if the EMA is poisoned anyway, save_model writes nothing and the previous
    checkpoint stays (Ultralytics would zero the NaN tensors with nan_to_num_ and save)."""
    init_sd = init_state(env)
    from ultralytics import YOLO

    yolo = YOLO(env.model)
    saved = {}

    def poison(trainer):
        if trainer.epoch == 1:
            with torch.no_grad():
                next(trainer.ema.ema.parameters()).view(-1)[0] = float("nan")

    def on_save(trainer):  # (8.3 fires on_model_save even when save_model wrote nothing)
        if trainer.epoch == 0:
            saved[0] = {k: v.detach().half() for k, v in trainer.ema.ema.state_dict().items()}

    yolo.add_callback("on_train_epoch_end", poison)
    yolo.add_callback("on_model_save", on_save)
    yolo.train(**{**BASE, "data": env.data, "project": str(env.root / "runs"), "name": "poison"})
    tr = yolo.trainer
    assert tr.guard.refused_saves == 1
    for path in (tr.last, tr.best):
        ck = check_clean_checkpoint(path, init_sd)
        sd = ck["model"].state_dict()  # stripped after training: the EMA of epoch 1
        assert all(torch.equal(saved[0][k], sd[k]) for k in sd if sd[k].is_floating_point())


# ----------------------------------------------------------------------------- the step itself: fp16, clip, DDP
def _holder(model, optimizer, scaler, ema=None, **args):
    """A trainer as optimizer_step sees it: the real BaseTrainer.optimizer_step (patched) is called on an object
    carrying real model / optimizer / GradScaler / ModelEMA, without building datasets."""
    a = dict(guard.GUARD_DEFAULTS, **args)
    return SimpleNamespace(args=SimpleNamespace(**a), model=model, optimizer=optimizer, scaler=scaler, ema=ema,
                           device=torch.device("cpu"), epoch=0)


def test_fp16_gradscaler_skip_counted_once_scale_adapts_ema_untouched(env):
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.utils.torch_utils import ModelEMA

    def make():
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
        return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.amp.GradScaler("cpu", init_scale=1024.0)

    x = torch.randn(8, 4)
    results = {}
    for mode in ("guard", "ultralytics"):
        net, opt, scaler = make()
        ema = ModelEMA(net)
        t = _holder(net, opt, scaler, ema, nan_guard=(mode == "guard"))
        guard._CALLBACKS["on_train_batch_start"](t)  # BN snapshot, as at on_train_batch_start
        w0 = [p.detach().clone() for p in net.parameters()]
        e0 = {k: v.clone() for k, v in ema.ema.state_dict().items()}
        scaler.scale(net(x).square().mean()).backward()
        net[0].weight.grad[0, 0] = float("inf")  # the scaler sees it in unscale_
        BaseTrainer.optimizer_step(t)
        assert all(torch.equal(a, b) for a, b in zip(w0, net.parameters()))  # the scaler skipped optimizer.step
        assert scaler.get_scale() == 512.0  # and backed off as usual
        results[mode] = ema.updates
        if mode == "guard":
            assert all(torch.equal(e0[k], v) for k, v in ema.ema.state_dict().items())  # EMA untouched
            assert t.guard.skipped == 1 and t.guard.amp_skipped == 1 and t.guard.consecutive == 1
            assert torch.equal(net[1].running_mean, e0["1.running_mean"])  # BN restored
            guard._CALLBACKS["on_train_batch_start"](t)
            scaler.scale(net(x).square().mean()).backward()  # a good step afterwards
            BaseTrainer.optimizer_step(t)
            assert not all(torch.equal(a, b) for a, b in zip(w0, net.parameters()))
            assert t.guard.steps == 2 and t.guard.skipped == 1 and t.guard.consecutive == 0 and ema.updates == 1
    assert results == {"guard": 0, "ultralytics": 1}  # Ultralytics updates the EMA even on a skipped fp16 step


@pytest.mark.parametrize("guard_on", [True, False])
@pytest.mark.parametrize("clip", [5.0, 0.0])
def test_clip_max_norm_exact(env, guard_on, clip):
    from ultralytics.engine.trainer import BaseTrainer

    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=1.0)
    t = _holder(torch.nn.ParameterList([p]), opt, torch.amp.GradScaler("cpu", enabled=False), nan_guard=guard_on,
                clip_max_norm=clip)
    p.grad = torch.tensor([12.0, 16.0, 0.0, 0.0])  # norm 20
    BaseTrainer.optimizer_step(t)
    expected = clip if clip > 0 else 20.0  # clip_max_norm=0 disables clipping
    assert torch.linalg.vector_norm(p.detach()).item() == pytest.approx(expected, rel=1e-6)


DDP_SCRIPT = """
import os, sys, json
from types import SimpleNamespace
import torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, {repo!r})

# 1) bootstrap as in the DDP worker script written by Ultralytics' generate_ddp_file: 8.4 unpickles the parent's
#    callbacks (the guard's install it) before building the trainer from the parent's args; 8.3 only runs the
#    script's own top level (the guard prepends an install there).
import runpy
from pathlib import Path
from ultralytics.utils import DEFAULT_CFG_DICT
from ultralytics.cfg import get_cfg
assert "nan_guard" not in DEFAULT_CFG_DICT
ddp_file = Path(sys.argv[3])
if ddp_file.with_suffix(".pt").exists():  # 8.4
    from ultralytics.utils.patches import torch_load
    overrides = torch_load(ddp_file.with_suffix(".pt"), map_location="cpu")["args"]
    assert "nan_guard" in DEFAULT_CFG_DICT  # installed by unpickling the callbacks alone
    runpy.run_path(str(ddp_file), run_name="ddp_probe")
else:  # 8.3: the args are a literal in the script
    overrides = runpy.run_path(str(ddp_file), run_name="ddp_probe")["overrides"]
cfg = DEFAULT_CFG_DICT.copy()
cfg.update(save_dir="")
args = get_cfg(cfg, overrides)
assert args.nan_guard is False and args.clip_max_norm == 2.0
from ultralytics.engine.trainer import BaseTrainer
assert getattr(BaseTrainer.optimizer_step, "_yolo_bimamba_guard", False)
import yolo_bimamba.guard as guard
from ultralytics.utils.torch_utils import ModelEMA

# 2) two forked gloo ranks with a DDP model

def worker(rank, world, init, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    res = dict(flag_any=guard.any_rank(torch.tensor(rank == 1)), flag_none=guard.any_rank(torch.tensor(False)))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ema = ModelEMA(ddp)
    args = SimpleNamespace(**dict(guard.GUARD_DEFAULTS, nan_guard=True))  # a stock model: the guard is opted in
    t = SimpleNamespace(args=args, model=ddp, optimizer=opt, ema=ema,
                        scaler=torch.amp.GradScaler("cpu", enabled=False), device=torch.device("cpu"), epoch=0)
    x = torch.randn(8, 4) + rank
    w0 = [p.detach().clone() for p in net.parameters()]
    guard._CALLBACKS["on_train_batch_start"](t)
    ddp(x).square().mean().backward()  # gradients all-reduced by DDP
    if rank == 1:
        net[0].weight.grad[0, 0] = float("nan")  # only rank 1's local gradient is bad
    BaseTrainer.optimizer_step(t)
    res["unchanged_after_bad"] = all(torch.equal(a, b) for a, b in zip(w0, net.parameters()))
    res["skipped"] = t.guard.skipped
    res["ema_updates"] = ema.updates
    guard._CALLBACKS["on_train_batch_start"](t)
    ddp(x).square().mean().backward()
    BaseTrainer.optimizer_step(t)
    res["changed_after_good"] = not all(torch.equal(a, b) for a, b in zip(w0, net.parameters()))
    res["steps"] = t.guard.steps
    res["w"] = [p.detach().sum().item() for p in net.parameters()]
    json.dump(res, open(out + str(rank), "w"))
    dist.destroy_process_group()

if __name__ == "__main__":
    init, out = sys.argv[1], sys.argv[2]
    mp.start_processes(worker, args=(2, init, out), nprocs=2, join=True, start_method="fork")
"""


def test_ddp_worker_bootstrap_and_all_ranks_take_the_same_decision(env, tmp_path):
    """(1) The state file written by Ultralytics' own generate_ddp_file, loaded in a fresh process, installs the guard
    before the worker's trainer config is validated. (2) Two gloo processes with a DDP model: only rank 1's gradient
    is non-finite, both ranks skip the step."""
    import json

    from ultralytics.utils.callbacks import get_default_callbacks
    from ultralytics.utils.dist import generate_ddp_file

    stand_in = SimpleNamespace(callbacks=get_default_callbacks(), model=torch.nn.Linear(2, 2), hub_session=None,
                               args=SimpleNamespace(**{**BASE, **guard.GUARD_DEFAULTS, "model": env.model}))
    guard.attach(stand_in)  # what the patched BaseTrainer.__init__ does
    stand_in.args.nan_guard, stand_in.args.clip_max_norm = False, 2.0
    file = Path(generate_ddp_file(stand_in))
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT.format(repo=str(REPO)))
    # the worker must install the guard by itself: with the package installed, its .pth autoload would already have
    # done so on `import ultralytics`, so it is switched off here to test the bootstrap path on its own
    environ = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "0", "YOLO_BIMAMBA_AUTOLOAD": "0"}
    environ.pop("RANK", None)
    environ.pop("LOCAL_RANK", None)
    try:
        subprocess.run([sys.executable, str(script), str(tmp_path / "init"), str(tmp_path / "res"), str(file)],
                       check=True, env=environ, timeout=300)
    finally:
        file.unlink(missing_ok=True)
        file.with_suffix(".pt").unlink(missing_ok=True)
    r = [json.loads((tmp_path / f"res{k}").read_text()) for k in (0, 1)]
    for x in r:
        assert x["flag_any"] is True and x["flag_none"] is False
        assert x["unchanged_after_bad"] and x["skipped"] == 1 and x["ema_updates"] == 0
        assert x["changed_after_good"] and x["steps"] == 2
    assert r[0]["w"] == r[1]["w"]  # ranks stay in sync

