"""Ultralytics hooks: config keys, ``BaseTrainer`` patches, the trainer callbacks and the DDP worker script."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import torch

from .batchnorm import _snapshot_bn
from .report import _add_debug_hooks, _log_replay, _remove_hooks, nonfinite_state
from .state import (
    _MARK,
    CSV_SKIPPED,
    CSV_SKIPPED_TOTAL,
    GUARD_DEFAULTS,
    ULTRALYTICS_CLIP,
    _log,
    clip_value,
    enabled,
    state,
)
from .step import _guarded_step, _plain_step

_KEY_TYPES = {  # Ultralytics key set -> our keys (typed validation in ultralytics.cfg.check_cfg)
    "CFG_BOOL_KEYS": ("nan_guard", "nan_debug"),
    "CFG_FLOAT_KEYS": ("clip_max_norm",),
    "CFG_INT_KEYS": ("nan_guard_max_skips",),
}
_PATCHED = ("__init__", "check_resume", "optimizer_step", "save_model", "save_metrics", "_handle_nan_recovery")


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

    def generate_ddp_file(trainer):
        file = orig(trainer)
        try:
            path = Path(file)
            root = str(Path(__file__).resolve().parents[2])  # the folder holding the yolo_bimamba package
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


def _drop_unused_keys(trainer) -> None:
    """A stock model with the guard's keys all unset trains as in Ultralytics alone: the keys leave its arguments, and
    args.yaml (written by ``BaseTrainer.__init__`` before the model existed) is written again without them, so the run's
    files and checkpoints (``train_args``) hold Ultralytics' keys only."""
    args = trainer.args
    if enabled(trainer) or any(getattr(args, k, v) != v for k, v in GUARD_DEFAULTS.items()):
        return
    present = [k for k in GUARD_DEFAULTS if k in vars(args)]
    if not present:
        return
    for k in present:
        delattr(args, k)
    from ultralytics.utils import RANK

    path = getattr(trainer, "save_dir", None)
    path = None if path is None else Path(path) / "args.yaml"
    if RANK in {-1, 0} and path is not None and path.is_file():
        try:
            from ultralytics.utils import YAML

            YAML.save(path, vars(args))
        except ImportError:  # Ultralytics 8.3
            from ultralytics.utils import yaml_save

            yaml_save(path, vars(args))


def _on_train_start(trainer):
    _drop_unused_keys(trainer)
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

