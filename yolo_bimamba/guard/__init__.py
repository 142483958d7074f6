"""Non-finite step guard for Ultralytics training.

Why: in Ultralytics' trainer one NaN/Inf gradient poisons the whole model and its EMA in a single step
(``clip_grad_norm_`` turns the clip coefficient into NaN), and ``save_model`` then writes a checkpoint in which
``nan_to_num_`` has silently zeroed every poisoned tensor. Under fp16 AMP the GradScaler hides the problem by
skipping such steps; fp32 and bf16 have no such protection.

``install()`` (idempotent; ``yolo_bimamba.ultralytics_glue.register()`` calls it, and ``import yolo_bimamba`` calls
that) registers the guard's training arguments and patches ``BaseTrainer``. The guard is then active for trainers
whose model contains a module of this package (our blocks) and for any model trained with ``nan_guard=True``; with
``nan_guard`` unset a stock model trains exactly as in Ultralytics alone (the original methods run, and the guard's
keys are dropped from its arguments at ``on_train_start``, so args.yaml and the checkpoints' ``train_args`` are
Ultralytics' own). ``nan_guard=False`` switches it off for any model, after which training is exactly Ultralytics'
(only a non-default ``clip_max_norm`` is honoured). ``uninstall()`` undoes ``install()``.
Patched: ``BaseTrainer.__init__`` (adds the guard's callbacks and ``trainer.guard``), ``check_resume`` (the guard's
switches may change when resuming), ``optimizer_step``, ``save_model``, ``save_metrics``, ``_handle_nan_recovery``,
and ``ultralytics.utils.dist.generate_ddp_file`` (DDP workers install the guard before validating the parent's args;
in 8.4 unpickling the guard's callbacks does it as well).

New training arguments (CLI ``yolo train ... key=value``, cfg YAML, ``model.train(key=value)``):

* ``nan_guard`` (bool, default unset = on for models with our blocks, off for stock models): the guard below.
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

Fault injection for tests (see tests/guard_harness.py): a one-shot ``Tensor.register_hook`` on a parameter, registered
at ``on_train_batch_start``, poisons the gradient autograd accumulates into ``param.grad`` before ``optimizer_step``
runs; a one-shot forward hook (``prepend=True``) poisons a module's output.

Supported: Ultralytics 8.4 (read against 8.4.190) and the 8.3 line (tests pass with 8.3.253: same method names, loss
items as one tensor, on_model_save fired even when nothing was saved, a DDP script without pickled callbacks).
"""

from .hooks import _CALLBACKS, attach, install, is_installed, uninstall
from .report import checkpoint_problems, first_nonfinite_grad, nonfinite_state
from .state import (
    CSV_SKIPPED,
    CSV_SKIPPED_TOTAL,
    GUARD_DEFAULTS,
    ULTRALYTICS_CLIP,
    GuardState,
    clip_value,
    enabled,
    has_our_modules,
    max_skips,
    state,
)
from .step import any_rank, clip_with_norm, total_grad_norm

__all__ = [
    "install", "uninstall", "is_installed", "attach", "enabled", "has_our_modules", "state", "clip_value", "max_skips",
    "GuardState", "GUARD_DEFAULTS", "CSV_SKIPPED", "CSV_SKIPPED_TOTAL", "ULTRALYTICS_CLIP", "total_grad_norm",
    "clip_with_norm", "any_rank", "first_nonfinite_grad", "nonfinite_state", "checkpoint_problems",
    "_CALLBACKS",
]
