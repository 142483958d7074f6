"""Tests of the non-finite step guard (yolo_bimamba/guard) in real Ultralytics training runs on CPU: its config
keys, faults injected into a run with the guard on and off, its limit of consecutive skips and its debug names.
The tiny detector, the dataset and the fault injection are in guard_harness.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from yolo_bimamba import guard
from guard_harness import (BASE, LAYER, PARAM, TINY_YAML, Interrupted, Run, all_finite, check_clean_checkpoint,
                           env, init_state, read_csv, train)  # noqa: F401 (env: the module's fixture)


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
