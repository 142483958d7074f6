"""The guard's training arguments and per-trainer state, and the helpers every part of the guard uses."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

GUARD_DEFAULTS = {"nan_guard": True, "nan_guard_max_skips": 25, "clip_max_norm": 10.0, "nan_debug": False}
CSV_SKIPPED, CSV_SKIPPED_TOTAL = "guard/skipped", "guard/skipped_total"
ULTRALYTICS_CLIP = 10.0  # the max_norm Ultralytics hard-codes in BaseTrainer.optimizer_step

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



# ------------------------------------------------------------------------------------------------ switches
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

