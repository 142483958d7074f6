"""Non-finite step guard for Ultralytics training (issue 5).

Why: in Ultralytics' trainer one NaN/Inf gradient poisons the whole model and its EMA in a single step
(``clip_grad_norm_`` turns the clip coefficient into NaN), and ``save_model`` then writes a checkpoint in which
``nan_to_num_`` has silently zeroed every poisoned tensor. Under fp16 AMP the GradScaler hides the problem by
skipping such steps; fp32 and bf16 have no such protection.

``install()`` (idempotent; ``yolo_bimamba.ultralytics_glue.register()`` calls it, and ``import yolo_bimamba`` calls
that) makes the guard active for EVERY Ultralytics trainer created in a process where ``yolo_bimamba`` is imported -
models with our blocks and stock models alike. ``nan_guard=False`` switches it off, after which training is exactly
Ultralytics' (the original methods run; only a non-default ``clip_max_norm`` is honoured). ``uninstall()`` undoes it.
Patched: ``BaseTrainer.__init__`` (adds the guard's callbacks and ``trainer.guard``), ``check_resume`` (the guard's
switches may change when resuming), ``optimizer_step``, ``save_model``, ``save_metrics``, ``_handle_nan_recovery``,
and ``ultralytics.utils.dist.generate_ddp_file`` (DDP workers install the guard before validating the parent's args;
in 8.4 unpickling the guard's callbacks does it as well).

New training arguments (CLI ``yolo train ... key=value``, cfg YAML, ``model.train(key=value)``):

* ``nan_guard`` (bool, default True): the guard below.
* ``nan_guard_max_skips`` (int >= 0, default 25): stop with a RuntimeError after this many CONSECUTIVE skipped
  optimizer steps; 0 never stops.
* ``clip_max_norm`` (float >= 0, default 10.0 = Ultralytics' hard-coded value): gradient clipping max-norm;
  0 disables clipping. Honoured with the guard on or off.
* ``nan_debug`` (bool, default False): forward hooks on every module, hooks on every module output's gradient and
  on every parameter's accumulated gradient; the first module whose forward output and the first module/parameter
  whose gradient is non-finite are logged once and kept in ``trainer.guard.debug_forward`` /
  ``trainer.guard.debug_backward``. Costs one host sync per module and per parameter each batch: debugging only.

What the guard does in ``BaseTrainer.optimizer_step`` (one optimizer step = one accumulation window of
``trainer.accumulate`` batches):

1. ``scaler.unscale_`` (a no-op without fp16 AMP), then the total gradient 2-norm. Under DDP the gradients are
   already all-reduced, yet the "non-finite" flag is still all-reduced (MAX) so that every rank takes the same
   decision. This costs one host sync per optimizer step.
2. Finite norm: clip to ``clip_max_norm`` with that norm, ``scaler.step``, ``scaler.update``, ``zero_grad``, EMA
   update - the same sequence and arithmetic as Ultralytics.
3. Non-finite norm: no optimizer step, no EMA update, ``zero_grad``, BatchNorm running statistics (running_mean,
   running_var, num_batches_tracked) restored in place to their values from before the first batch of the window
   (snapshot taken at ``on_train_batch_start``; the forward of the bad batch already changed them), the skip is
   counted, logged with the first parameter (model order) whose gradient is non-finite, and after
   ``nan_guard_max_skips`` consecutive skips a RuntimeError names that parameter.
   fp16 AMP: the GradScaler found the same non-finite gradients in ``unscale_``; the guard still calls
   ``scaler.step`` (which skips the optimizer by itself) and ``scaler.update`` so that the loss scale backs off
   exactly as without the guard - the guard does not fight the scaler. The step is counted ONCE, in
   ``guard.skipped``, whoever skipped it; ``guard.amp_skipped`` says how many of those the scaler skipped (its
   loss-scale calibration at the start of a run shows up there). Either way the EMA is not updated and BatchNorm
   statistics are restored.

Counters (``trainer.guard``: ``skipped``, ``skipped_epoch``, ``amp_skipped``, ``consecutive``, ``steps``,
``first_bad_param``) are logged at each skip and at each epoch end, and written to results.csv as the columns
``guard/skipped`` (this epoch) and ``guard/skipped_total`` (whole run, restored from results.csv on resume).
Batches whose loss items are non-finite are left out of the epoch's running mean loss (``trainer.tloss``), so the
train loss columns stay finite.

Checkpoints: before ``save_model`` the EMA and the optimizer state (what a checkpoint holds) are checked; if either
holds a non-finite value nothing is written (the previous last.pt/best.pt stay, ``guard.refused_saves`` counts it)
and an error is logged - Ultralytics' ``nan_to_num_`` can then never zero a poisoned tensor. Non-finite live model
weights are logged as a warning. Known limit: finite fp32 values beyond the fp16 range (65504) are clamped by
Ultralytics 8.4 when it converts the EMA to fp16, but would become inf in 8.3 checkpoints and in the fp16 copy of
the optimizer state (8.3 and 8.4).

What is NOT caught: a step with finite gradients that drives weights to inf (absurd learning rate). The following
steps then have non-finite gradients and the run stops after ``nan_guard_max_skips``; checkpoints stay clean.
Ultralytics' NaN recovery (reload last.pt when the epoch's last loss is NaN) is bypassed when the guard handles that
batch and the EMA, weights and optimizer state are finite (it would only throw away an epoch).

Fault injection for tests (see tests/test_guard.py): a one-shot ``Tensor.register_hook`` on a parameter, registered
at ``on_train_batch_start``, poisons the gradient autograd accumulates into ``param.grad`` before ``optimizer_step``
runs; a one-shot forward hook (``prepend=True``) poisons a module's output.

Supported: Ultralytics 8.4 (read against 8.4.190) and the 8.3 line (tests pass with 8.3.253: same method names, loss
items as one tensor, on_model_save fired even when nothing was saved, a DDP script without pickled callbacks).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import torch
from torch import nn

GUARD_DEFAULTS = {"nan_guard": True, "nan_guard_max_skips": 25, "clip_max_norm": 10.0, "nan_debug": False}
CSV_SKIPPED, CSV_SKIPPED_TOTAL = "guard/skipped", "guard/skipped_total"
ULTRALYTICS_CLIP = 10.0  # the max_norm Ultralytics hard-codes in BaseTrainer.optimizer_step

_KEY_TYPES = {  # Ultralytics key set -> our keys (typed validation in ultralytics.cfg.check_cfg)
    "CFG_BOOL_KEYS": ("nan_guard", "nan_debug"),
    "CFG_FLOAT_KEYS": ("clip_max_norm",),
    "CFG_INT_KEYS": ("nan_guard_max_skips",),
}
_PATCHED = ("__init__", "check_resume", "optimizer_step", "save_model", "save_metrics", "_handle_nan_recovery")
_MARK = "_yolo_bimamba_guard"


@dataclass
class GuardState:
    """Per-trainer guard state, at ``trainer.guard``."""

    steps: int = 0  # optimizer steps attempted (guarded)
    skipped: int = 0  # steps skipped because the gradients were non-finite (whoever skipped them), whole run
    skipped_epoch: int = 0  # same, current epoch
    amp_skipped: int = 0  # of `skipped`, those the fp16 GradScaler skipped itself
    consecutive: int = 0  # current streak of skipped steps
    first_bad_param: str | None = None  # first parameter with a non-finite gradient in the current streak
    last_bad_param: str | None = None  # same, most recent skipped step
    refused_saves: int = 0  # save_model calls that wrote nothing because the state was not finite
    batch: int = -1  # batch index within the epoch (counted at on_train_batch_start)
    debug_forward: str | None = None  # nan_debug: first module with a non-finite forward output
    debug_backward: str | None = None  # nan_debug: first module output / parameter with a non-finite gradient
    need_snapshot: bool = field(default=True, repr=False)
    bn_model_id: int | None = field(default=None, repr=False)
    bn_live: list = field(default_factory=list, repr=False)  # BatchNorm buffers of the model (live tensors)
    bn_saved: list = field(default_factory=list, repr=False)  # their snapshot
    loss_sum: object = field(default=None, repr=False)  # running sum of the finite loss items this epoch
    loss_n: int = 0
    loss_bad: int = 0  # batches this epoch with non-finite loss items
    hooks: list = field(default_factory=list, repr=False)


# ----------------------------------------------------------------------------------------------------------- install
_installed = False
_lock = threading.RLock()


def install() -> None:
    """Register the guard's config keys and patch ``BaseTrainer`` (idempotent; safe to call many times)."""
    global _installed
    with _lock:
        if _installed:
            return
        _register_cfg_keys()
        _patch_trainer()
        _patch_ddp_file()
        _installed = True


def uninstall() -> None:
    """Undo ``install()``: restore the original methods and remove the config keys (trainers keep their callbacks,
    which do nothing without the patched methods' state)."""
    global _installed
    import ultralytics.cfg as ucfg
    import ultralytics.utils as uu
    import ultralytics.utils.dist as udist
    from ultralytics.engine.trainer import BaseTrainer

    with _lock:
        for name in _PATCHED:
            fn = BaseTrainer.__dict__.get(name)
            if getattr(fn, _MARK, False):
                setattr(BaseTrainer, name, fn.__wrapped__)
        if getattr(udist.generate_ddp_file, _MARK, False):
            udist.generate_ddp_file = udist.generate_ddp_file.__wrapped__
        for k in GUARD_DEFAULTS:
            uu.DEFAULT_CFG_DICT.pop(k, None)
            if k in vars(uu.DEFAULT_CFG):
                delattr(uu.DEFAULT_CFG, k)
        for set_name, keys in _KEY_TYPES.items():
            cur = getattr(ucfg, set_name, None)
            if isinstance(cur, set):
                cur.difference_update(keys)
            elif isinstance(cur, frozenset):
                setattr(ucfg, set_name, cur - frozenset(keys))
        if isinstance(getattr(ucfg, "CFG_INT_MIN", None), dict):
            ucfg.CFG_INT_MIN.pop("nan_guard_max_skips", None)
        _installed = False


def is_installed() -> bool:
    return _installed


def _register_cfg_keys() -> None:
    import ultralytics.cfg as ucfg
    import ultralytics.utils as uu

    for k, v in GUARD_DEFAULTS.items():
        uu.DEFAULT_CFG_DICT.setdefault(k, v)  # the dict shared by ultralytics.cfg, nn.tasks, engine.model, ...
        if k not in vars(uu.DEFAULT_CFG):  # the namespace BaseTrainer(cfg=DEFAULT_CFG) starts from
            setattr(uu.DEFAULT_CFG, k, v)
    keys = getattr(uu, "DEFAULT_CFG_KEYS", None)  # a live view of DEFAULT_CFG_DICT's keys in 8.x
    if isinstance(keys, (set, frozenset)):  # defensive: older layouts held a copy
        import ultralytics.utils.torch_utils as tu

        new = frozenset(keys) | frozenset(GUARD_DEFAULTS)
        for mod in (uu, tu, ucfg):
            if getattr(mod, "DEFAULT_CFG_KEYS", None) is keys:
                setattr(mod, "DEFAULT_CFG_KEYS", new if isinstance(keys, frozenset) else set(new))
    for set_name, names in _KEY_TYPES.items():
        cur = getattr(ucfg, set_name, None)
        if isinstance(cur, set):
            cur.update(names)
        elif isinstance(cur, frozenset):  # check_cfg reads the module global at call time
            setattr(ucfg, set_name, cur | frozenset(names))
    if isinstance(getattr(ucfg, "CFG_INT_MIN", None), dict):
        ucfg.CFG_INT_MIN.setdefault("nan_guard_max_skips", 0)


_DDP_PROLOGUE = """# yolo-bimamba: install the non-finite step guard before the trainer validates its arguments
import sys as _yb_sys
if {root!r} not in _yb_sys.path:
    _yb_sys.path.append({root!r})
import yolo_bimamba.guard as _yb_guard
_yb_guard.install()
"""


def _patch_ddp_file() -> None:
    """Multi-GPU runs start workers from a script Ultralytics writes (utils.dist.generate_ddp_file). In 8.3 that script
    only imports the trainer class and passes the parent's args, which hold the guard's keys, so a worker without the
    guard would reject them: a prologue that installs the guard is prepended to the script. (8.4 unpickles the
    parent's callbacks first, which installs the guard too, see _Callback.)"""
    import ultralytics.utils.dist as udist

    orig = getattr(udist, "generate_ddp_file", None)
    if orig is None or getattr(orig, _MARK, False):
        return
    from pathlib import Path

    def generate_ddp_file(trainer):
        file = orig(trainer)
        try:
            path = Path(file)
            root = str(Path(__file__).resolve().parents[1])  # the folder holding the yolo_bimamba package
            path.write_text(_DDP_PROLOGUE.format(root=root) + path.read_text(encoding="utf-8"), encoding="utf-8")
        except OSError as e:
            _log("warning", f"nan_guard: could not prepare the DDP worker script {file}: {e}")
        return file

    generate_ddp_file.__wrapped__ = orig
    generate_ddp_file.__doc__ = orig.__doc__
    setattr(generate_ddp_file, _MARK, True)
    udist.generate_ddp_file = generate_ddp_file


def _wrap(cls, name, make):
    orig = cls.__dict__[name]
    if getattr(orig, _MARK, False):
        return
    fn = make(orig)
    fn.__name__, fn.__qualname__, fn.__doc__ = orig.__name__, orig.__qualname__, orig.__doc__
    fn.__wrapped__ = orig
    setattr(fn, _MARK, True)
    setattr(cls, name, fn)


def _patch_trainer() -> None:
    from ultralytics.engine.trainer import BaseTrainer

    def make_init(orig):
        def __init__(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            attach(self)

        return __init__

    def make_check_resume(orig):
        def check_resume(self, overrides):
            overrides = dict(overrides or {})
            ours = {k: overrides.pop(k) for k in GUARD_DEFAULTS if k in overrides}
            orig(self, overrides)
            for k, v in ours.items():  # the guard's switches may be changed when resuming
                setattr(self.args, k, v)

        return check_resume

    def make_optimizer_step(orig):
        def optimizer_step(self):
            if not enabled(self):
                clip = clip_value(self)
                if clip == ULTRALYTICS_CLIP:
                    return orig(self)  # exactly Ultralytics
                return _plain_step(self, clip)
            return _guarded_step(self)

        return optimizer_step

    def make_save_model(orig):
        def save_model(self):
            if enabled(self):
                bad = nonfinite_state(self, parts=("ema", "optimizer"))  # what the checkpoint holds
                if bad:
                    st = state(self)
                    st.refused_saves += 1
                    _log("error", f"nan_guard: NOT saving checkpoints at epoch {self.epoch + 1}: {bad}; the previous "
                         f"{self.last.name}/{self.best.name} are kept")
                    return False
                bad = nonfinite_state(self, parts=("model",), buffers=False)
                if bad:
                    _log("warning", f"nan_guard: {bad} (the checkpoint holds the finite EMA)")
            return orig(self)

        return save_model

    def make_nan_recovery(orig):
        def _handle_nan_recovery(self, epoch):
            loss = getattr(self, "loss", None)
            if enabled(self) and loss is not None and not bool(torch.isfinite(loss).all()):
                fit = getattr(self, "fitness", None)
                if (fit is None or math.isfinite(float(fit))) and not nonfinite_state(
                    self, parts=("ema", "model", "optimizer"), buffers=False
                ):
                    _log("info", "nan_guard: the epoch's last loss is not finite, but the guard skips that step and "
                         "the weights are finite, so Ultralytics' reload of last.pt is not needed")
                    self.loss = None  # hide it from Ultralytics' check (which still runs: DDP broadcast)
                    try:
                        return orig(self, epoch)
                    finally:
                        self.loss = loss
            return orig(self, epoch)

        return _handle_nan_recovery

    def make_save_metrics(orig):
        def save_metrics(self, metrics):
            if _csv_takes_guard_columns(self, enabled(self)):
                st = state(self)
                metrics = {**metrics, CSV_SKIPPED: st.skipped_epoch, CSV_SKIPPED_TOTAL: st.skipped}
            return orig(self, metrics)

        return save_metrics

    _wrap(BaseTrainer, "__init__", make_init)
    _wrap(BaseTrainer, "check_resume", make_check_resume)
    _wrap(BaseTrainer, "optimizer_step", make_optimizer_step)
    _wrap(BaseTrainer, "save_model", make_save_model)
    _wrap(BaseTrainer, "save_metrics", make_save_metrics)
    if "_handle_nan_recovery" in BaseTrainer.__dict__:  # 8.4 and late 8.3
        _wrap(BaseTrainer, "_handle_nan_recovery", make_nan_recovery)


# ------------------------------------------------------------------------------------------------------- trainer glue
def _csv_takes_guard_columns(trainer, default: bool) -> bool:
    """Whether results.csv rows get the guard's columns: when the file exists, exactly when its header has them (a
    resume that switched the guard on or off must not misalign the columns), else when the guard is on."""
    csv = getattr(trainer, "csv", None)
    try:
        if csv is None or not csv.exists():
            return default
        with open(csv, encoding="utf-8") as f:
            header = f.readline()
    except OSError:
        return default
    return CSV_SKIPPED in header


def enabled(trainer) -> bool:
    return bool(getattr(trainer.args, "nan_guard", True))


def clip_value(trainer) -> float:
    v = getattr(trainer.args, "clip_max_norm", ULTRALYTICS_CLIP)
    return ULTRALYTICS_CLIP if v is None else float(v)


def max_skips(trainer) -> int:
    v = getattr(trainer.args, "nan_guard_max_skips", GUARD_DEFAULTS["nan_guard_max_skips"])
    return 0 if v is None else int(v)


def state(trainer) -> GuardState:
    st = trainer.__dict__.get("guard")
    if not isinstance(st, GuardState):
        st = GuardState()
        trainer.guard = st
    return st


class _Callback:
    """A trainer callback that re-installs the guard when unpickled (the DDP worker unpickles the parent's callbacks
    before it builds its trainer, whose config then must already know the guard's keys)."""

    def __init__(self, event, fn):
        self.event, self.fn = event, fn

    def __call__(self, trainer):
        return self.fn(trainer)

    def __reduce__(self):
        return _callback_for, (self.event,)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return f"yolo_bimamba.guard.{self.fn.__name__}"


def _callback_for(event):
    install()
    return _CALLBACKS[event]


def attach(trainer) -> None:
    """Give a trainer its guard state and callbacks (done by the patched ``BaseTrainer.__init__``)."""
    st = state(trainer)
    for k, lo in (("clip_max_norm", 0.0), ("nan_guard_max_skips", 0)):
        v = getattr(trainer.args, k, None)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= lo
                              or not math.isfinite(v)):
            raise ValueError(f"'{k}={v}' is invalid: it must be a finite number >= {lo}")
    cbs = trainer.callbacks
    for event, cb in _CALLBACKS.items():
        if cb not in cbs[event]:
            cbs[event].append(cb)
    return st


def _on_train_start(trainer):
    st = state(trainer)
    st.need_snapshot = True
    if getattr(trainer.args, "resume", False):
        try:  # keep the run's total across a resume
            col = trainer.read_results_csv().get(CSV_SKIPPED_TOTAL)
            if col:
                st.skipped = int(col[-1])
        except Exception:
            pass
    _remove_hooks(st)
    if getattr(trainer.args, "nan_debug", False):
        _add_debug_hooks(trainer, st)


def _on_train_epoch_start(trainer):
    st = state(trainer)
    st.batch = -1
    st.skipped_epoch = 0
    st.loss_sum, st.loss_n, st.loss_bad = None, 0, 0
    if getattr(trainer, "nan_recovery_attempts", 0):  # Ultralytics just reloaded last.pt: a new window begins
        st.need_snapshot = True


def _on_train_batch_start(trainer):
    st = state(trainer)
    st.batch += 1
    if enabled(trainer) and st.need_snapshot:
        _snapshot_bn(trainer, st)
        st.need_snapshot = False


def _on_train_batch_end(trainer):
    if not enabled(trainer):
        return
    st = state(trainer)
    items = getattr(trainer, "loss_items", None)
    if items is None:
        return
    vals = list(items.values()) if isinstance(items, dict) else [items]
    vals = [v.detach().float().reshape(-1) if torch.is_tensor(v) else torch.tensor([float(v)]) for v in vals]
    dev = vals[0].device
    if bool(torch.isfinite(torch.cat([v.to(dev) for v in vals])).all()):  # one host sync per batch
        if isinstance(items, dict):
            cur = {k: v.detach().clone() if torch.is_tensor(v) else float(v) for k, v in items.items()}
            st.loss_sum = cur if st.loss_sum is None else {k: st.loss_sum[k] + cur[k] for k in cur}
        else:
            st.loss_sum = items.detach().clone() if st.loss_sum is None else st.loss_sum + items.detach()
        st.loss_n += 1
    else:
        st.loss_bad += 1
    if st.loss_bad and st.loss_n:  # the running mean over the finite batches only
        if isinstance(st.loss_sum, dict):
            trainer.tloss = {k: v / st.loss_n for k, v in st.loss_sum.items()}
        else:
            trainer.tloss = st.loss_sum / st.loss_n


def _on_train_epoch_end(trainer):
    if not enabled(trainer):
        return
    st = state(trainer)
    if st.skipped_epoch:
        _log("warning", f"nan_guard: epoch {trainer.epoch + 1}: skipped {st.skipped_epoch} optimizer step(s) with "
             f"non-finite gradients ({st.skipped} in this run, {st.amp_skipped} of them by the fp16 GradScaler)")
    if st.loss_bad:
        _log("warning", f"nan_guard: epoch {trainer.epoch + 1}: {st.loss_bad} batch(es) with non-finite loss were "
             "left out of the epoch's mean train loss")


def _on_train_end(trainer):
    st = state(trainer)
    _remove_hooks(st)
    if enabled(trainer) and st.skipped:
        _log("warning", f"nan_guard: {st.skipped} of {st.steps} optimizer steps were skipped (non-finite gradients)")
    _log_replay(trainer)


def _log_replay(trainer):
    """Say whether the BiMamba layers replayed CUDA graphs (yolo_bimamba.nn.cuda_graph), on CUDA training only."""
    if getattr(getattr(trainer, "device", None), "type", None) != "cuda" or getattr(trainer, "model", None) is None:
        return
    from .nn import cuda_graph
    from .nn.blocks import BiMambaLayer2D

    model = _unwrap(trainer.model)
    if any(isinstance(m, BiMambaLayer2D) for m in model.modules()):
        _log("info", f"yolo_bimamba: {cuda_graph.summary(model, BiMambaLayer2D)}")


def _on_teardown(trainer):
    _remove_hooks(state(trainer))


_CALLBACKS = {
    "on_train_start": _Callback("on_train_start", _on_train_start),
    "on_train_epoch_start": _Callback("on_train_epoch_start", _on_train_epoch_start),
    "on_train_batch_start": _Callback("on_train_batch_start", _on_train_batch_start),
    "on_train_batch_end": _Callback("on_train_batch_end", _on_train_batch_end),
    "on_train_epoch_end": _Callback("on_train_epoch_end", _on_train_epoch_end),
    "on_train_end": _Callback("on_train_end", _on_train_end),
    "teardown": _Callback("teardown", _on_teardown),
}


# ------------------------------------------------------------------------------------------------------ the step
def _unwrap(model):
    """The module inside DDP / DataParallel (Ultralytics' unwrap_model does this, but 8.3.0 lacks it)."""
    return model.module if isinstance(model, (nn.parallel.DataParallel, nn.parallel.DistributedDataParallel)) else model


def _rank():
    from ultralytics.utils import RANK

    return RANK


def _log(level, msg):
    from ultralytics.utils import LOGGER

    if _rank() in {-1, 0}:
        getattr(LOGGER, level)(msg)


def _foreach_ok(trainer):
    return not (trainer.device.type == "npu")  # Ultralytics clips with foreach=False on NPU


def total_grad_norm(params, foreach=None, device=None):
    """2-norm over all gradients (a 0-dim tensor, not synchronised)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)  # on the trainer's device: NCCL reduces only CUDA tensors
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        return torch.nn.utils.get_total_norm(grads, 2.0, error_if_nonfinite=False, foreach=foreach)
    norms = [torch.linalg.vector_norm(g.detach(), 2.0) for g in grads]
    return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]), 2.0)


def clip_with_norm(params, max_norm, total_norm, foreach=None):
    """Scale the gradients so that their total norm is at most max_norm (the arithmetic of clip_grad_norm_)."""
    params = [p for p in params if p.grad is not None]
    if hasattr(torch.nn.utils, "clip_grads_with_norm_"):  # torch >= 2.6 (clip_grad_norm_ = get_total_norm + this)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm, foreach=foreach)
    else:
        torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm, foreach=foreach)


def any_rank(flag: torch.Tensor) -> bool:
    """True on every rank if the flag is true on any rank (all_reduce MAX under torch.distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = flag.detach().to(torch.float32).reshape(1).clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)
    return bool(flag)


def _plain_step(trainer, clip):
    """Ultralytics' optimizer_step with a configurable max-norm (the guard is off)."""
    trainer.scaler.unscale_(trainer.optimizer)
    if clip > 0:
        foreach = None if _foreach_ok(trainer) else False
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), max_norm=clip, foreach=foreach)
    trainer.scaler.step(trainer.optimizer)
    trainer.scaler.update()
    trainer.optimizer.zero_grad()
    if trainer.ema:
        trainer.ema.update(trainer.model)


def _guarded_step(trainer):
    st = state(trainer)
    st.steps += 1
    scaler, optimizer = trainer.scaler, trainer.optimizer
    scaler.unscale_(optimizer)
    params = list(trainer.model.parameters())
    foreach = None if _foreach_ok(trainer) else False
    total = total_grad_norm(params, foreach=foreach, device=trainer.device)
    local_bad = ~torch.isfinite(total)
    bad = any_rank(local_bad)
    st.need_snapshot = True  # the next batch opens a new accumulation window
    if not bad:
        clip = clip_value(trainer)
        if clip > 0:
            clip_with_norm(params, clip, total, foreach=foreach)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        if trainer.ema:
            trainer.ema.update(trainer.model)
        st.consecutive = 0
        st.first_bad_param = None
        return

    # ---- skip: no optimizer step, no EMA update
    by_scaler = scaler.is_enabled() and bool(local_bad)
    scale_msg = ""
    if scaler.is_enabled():
        old = scaler.get_scale()
        if by_scaler:
            scaler.step(optimizer)  # the scaler saw the same inf/NaN in unscale_ and skips optimizer.step itself
        scaler.update()  # lets the loss scale back off as it would without the guard
        scale_msg = f", fp16 loss scale {old:g} -> {scaler.get_scale():g}"
    name, n_bad, n_all = first_nonfinite_grad(trainer)
    optimizer.zero_grad()
    _restore_bn(trainer, st)
    st.skipped += 1
    st.skipped_epoch += 1
    st.amp_skipped += int(by_scaler)
    st.consecutive += 1
    st.last_bad_param = name
    if st.first_bad_param is None:
        st.first_bad_param = name
    who = "the fp16 GradScaler skipped the optimizer step" if by_scaler else "skipped the optimizer step"
    _log("warning" if not by_scaler else "info",
         f"nan_guard: non-finite gradient norm ({float(total):g}) at epoch {trainer.epoch + 1} batch {st.batch + 1}: "
         f"{who}, the EMA update, and restored BatchNorm statistics [{st.consecutive} consecutive, {st.skipped} in "
         f"this run{scale_msg}]; first parameter with a non-finite gradient: {name} ({n_bad}/{n_all} parameters)")
    limit = max_skips(trainer)
    if limit and st.consecutive >= limit:
        extra = ""
        if st.debug_forward or st.debug_backward:
            extra = f" nan_debug: first non-finite forward output in {st.debug_forward}, first non-finite gradient " \
                    f"in {st.debug_backward}."
        raise RuntimeError(
            f"nan_guard: {st.consecutive} consecutive optimizer steps had non-finite gradients "
            f"(nan_guard_max_skips={limit}); the first parameter with a non-finite gradient was "
            f"'{st.first_bad_param}' (most recent: '{name}').{extra} Lower lr0, use nan_debug=True to find the "
            f"module, or set nan_guard_max_skips=0 to never stop."
        )


def first_nonfinite_grad(trainer):
    """(name of the first parameter in model order with a non-finite gradient, how many, how many with grads)."""
    first, n_bad, n_all = None, 0, 0
    for name, p in _unwrap(trainer.model).named_parameters():
        if p.grad is None:
            continue
        n_all += 1
        if not bool(torch.isfinite(p.grad).all()):
            n_bad += 1
            first = first or name
    return first or "<none: the total norm overflowed>", n_bad, n_all


# ------------------------------------------------------------------------------------------------------- BatchNorm
def _bn_buffers(model):
    out = []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:
            for b in (m.running_mean, m.running_var, m.num_batches_tracked):
                if b is not None:
                    out.append(b)
    return out


def _snapshot_bn(trainer, st):
    model = _unwrap(trainer.model)
    live = _bn_buffers(model)
    if st.bn_model_id != id(model) or len(live) != len(st.bn_live) or any(a is not b for a, b in zip(live, st.bn_live)):
        st.bn_model_id, st.bn_live = id(model), live
        st.bn_saved = [b.detach().clone() for b in live]
        return
    _copy_all(st.bn_saved, live)


def _restore_bn(trainer, st):
    """Copy the snapshot back IN PLACE (ModelEMA keeps references to the model's tensors)."""
    if not st.bn_live or st.bn_model_id != id(_unwrap(trainer.model)):
        return
    _copy_all(st.bn_live, st.bn_saved)


def _copy_all(dst, src):
    with torch.no_grad():
        if hasattr(torch, "_foreach_copy_"):  # one call instead of one launch per buffer
            torch._foreach_copy_(dst, src)
        else:
            for d, s in zip(dst, src):
                d.copy_(s)


# ------------------------------------------------------------------------------------------------------ checkpoints
def _tensors(obj, prefix=""):
    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}.{i}" if prefix else str(i))


def _first_nonfinite(items):
    for k, v in items:
        if v.is_floating_point() or v.is_complex():
            if not bool(torch.isfinite(v).all()):
                return k
    return None


def nonfinite_state(trainer, parts=("ema", "model", "optimizer"), buffers=True) -> str | None:
    """Describe the first non-finite tensor of the EMA, the live model or the optimizer state (None: all finite).

    buffers=False checks only the model's parameters (its BatchNorm statistics may be poisoned by a bad batch of a
    still open accumulation window; the guard restores them at that window's step)."""
    for what in parts:
        if what == "ema":
            ema = getattr(getattr(trainer, "ema", None), "ema", None)
            if ema is None:
                continue
            items = ema.state_dict().items()
        elif what == "model":
            m = _unwrap(trainer.model)
            items = m.state_dict().items() if buffers else m.named_parameters()
        else:
            if getattr(trainer, "optimizer", None) is None:
                continue
            items = _tensors(trainer.optimizer.state_dict().get("state", {}))
        k = _first_nonfinite(items)
        if k is not None:
            return f"{'optimizer state' if what == 'optimizer' else what} tensor '{k}' is not finite"
    return None


def checkpoint_problems(ckpt) -> list[str]:
    """Non-finite tensors anywhere in a loaded checkpoint dict (EMA/model modules, optimizer state, ...)."""
    bad = []
    for key in ("ema", "model"):
        m = ckpt.get(key)
        if isinstance(m, nn.Module):
            bad += [f"{key}.{k}" for k, v in m.state_dict().items() if v.is_floating_point()
                    and not bool(torch.isfinite(v).all())]
    for key in ("optimizer", "scaler"):
        bad += [f"{key}.{k}" for k, v in _tensors(ckpt.get(key) or {}) if v.is_floating_point()
                and not bool(torch.isfinite(v).all())]
    return bad


# ------------------------------------------------------------------------------------------------------- nan_debug
def _iter_tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _iter_tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _iter_tensors(x)


def _add_debug_hooks(trainer, st):
    model = _unwrap(trainer.model)

    def report_fwd(name):
        if st.debug_forward is None:
            st.debug_forward = name
            _log("warning", f"nan_debug: first non-finite forward output in module '{name}' "
                 f"(epoch {trainer.epoch + 1}, batch {st.batch + 1})")

    def report_bwd(what):
        if st.debug_backward is None:
            st.debug_backward = what
            _log("warning", f"nan_debug: first non-finite gradient in {what} "
                 f"(epoch {trainer.epoch + 1}, batch {st.batch + 1})")

    def fwd_hook(name):
        def hook(module, inputs, output):
            if not module.training:
                return
            for t in _iter_tensors(output):
                if not t.is_floating_point():
                    continue
                if st.debug_forward is None and not bool(torch.isfinite(t).all()):
                    report_fwd(name)
                if st.debug_backward is None and t.requires_grad and torch.is_grad_enabled():
                    t.register_hook(grad_hook(name))

        return hook

    def grad_hook(name):
        def hook(g):
            if st.debug_backward is None and not bool(torch.isfinite(g).all()):
                report_bwd(f"the output gradient of module '{name}'")

        return hook

    def param_hook(name):
        def hook(p):
            if st.debug_backward is None and p.grad is not None and not bool(torch.isfinite(p.grad).all()):
                report_bwd(f"parameter '{name}'")

        return hook

    for name, m in model.named_modules():
        st.hooks.append(m.register_forward_hook(fwd_hook(name or "<model>")))
    if hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):  # torch >= 2.1: sees the accumulated .grad
        for name, p in model.named_parameters():
            if p.requires_grad:
                st.hooks.append(p.register_post_accumulate_grad_hook(param_hook(name)))


def _remove_hooks(st):
    for h in st.hooks:
        h.remove()
    st.hooks.clear()
