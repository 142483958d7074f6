"""Stress inputs of the kernels, shared by the CPU tests (tests/test_triton_kernels_behaviour.py) and the GPU suite
(tests/gpu/test_gpu_kernels.py): how dt (before softplus) and A are drawn. Values are bf16-representable so one
float64 reference serves fp32 and bf16 runs. Device-free: the callers move the tensors."""
from __future__ import annotations

import torch


def uniform_bf16(lo, hi):
    """dt_raw recipe: U[lo, hi), rounded to bf16 values; called as recipe(generator, shape)."""
    return lambda gen, shape: (torch.rand(shape, generator=gen) * (hi - lo) + lo).to(torch.bfloat16).float()


#: name -> keyword arguments of the inputs: dt_raw (a recipe), dt_softplus (default True), A (per head; 8 heads)
STRESS = {
    # softplus input up to +10: dt_raw + dt_bias spans about [-10, +10]
    "softplus-input-10": dict(dt_raw=uniform_bf16(-10.0, 10.0)),
    # dt up to 1e2 (no softplus) with A down to -1e2
    "dt-1e2-A-1e2": dict(dt_raw=uniform_bf16(1e-3, 100.0), dt_softplus=False, A=-torch.logspace(-2, 2, 8)),
    # decays of exp(-1e4) next to none at all (A ~ 0 in some heads; exact 0 is a clamp boundary,
    # tested on its own in the GPU suite's test_clamp_boundary_gradients)
    "A-zero-and-huge": dict(dt_raw=uniform_bf16(1e-3, 100.0), dt_softplus=False,
                            A=torch.tensor([-1e-12, -100.0, -1e-12, -1e-4, -100.0, -1.0, -1e-12, -50.0])),
}
