"""Session 32: the backward segment kernel with its inputs through tensor descriptors (force_config(tma=True)) on the
GPU: every gradient equal, bit for bit, to the pointer loads', under every backward config that fits, at three
problem families and four modes (bf16; L not a multiple of any chunk; several segments). Prints one line per case
and "ALL EQUAL" or the first differences. It needs tma-descriptors.patch (beside it) applied, which the tree does not
carry (force_config(tma=) and triton_op.tma_ok are the patch's). From the repository root, patched:
python benchmarks/results/session32/tma_check.py
"""
import importlib.util
import sys

import torch

sys.path.insert(0, ".")
# enters the package without Ultralytics where that is missing (the GPU machine)
_spec = importlib.util.spec_from_file_location("bench_kernels", "benchmarks/bench_kernels.py")
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))
from yolo_bimamba.ops import triton_op  # noqa: E402
from yolo_bimamba.ops.triton_kernels import BWD_CONFIGS, bwd_config_fits  # noqa: E402
from yolo_bimamba.ops.triton_op import bi_ssd_triton, force_config  # noqa: E402

dev = "cuda"
bad = 0
cases = 0
for (p, n, h, g), mode in [((64, 64, 8, 1), "both"), ((64, 64, 8, 1), "both-split"), ((32, 32, 8, 1), "both"),
                           ((64, 128, 4, 1), "both"), ((64, 64, 4, 2), "hydra"), ((64, 64, 4, 1), "backward")]:
    gen = torch.Generator(device="cpu").manual_seed(p + n + h)
    b, l = 2, 1000
    mk = lambda *s, scale=1.0, shift=0.0: (torch.randn(*s, generator=gen) * scale + shift).to(dev, torch.bfloat16)  # noqa
    x, dt, B, C = mk(b, l, h, p), mk(b, l, h, scale=0.7, shift=-0.5), mk(b, l, g, n, scale=n ** -0.5), mk(b, l, g, n, scale=n ** -0.5)
    A = (-torch.rand(h, generator=gen) - 0.1).to(dev)
    kw = dict(D=torch.randn(h, device=dev), dt_bias=torch.randn(h, device=dev) * 0.3, dt_softplus=True)
    if mode == "hydra":
        kw.update(shift=True, dt_bwd=mk(b, l, h, scale=0.7, shift=-0.5), B_bwd=mk(b, l, g, n, scale=n ** -0.5),
                  C_bwd=mk(b, l, g, n, scale=n ** -0.5))
    if mode == "backward":
        kw.update(direction="backward")
    leaves = [x, dt, A, B, C] + [v for v in kw.values() if isinstance(v, torch.Tensor)]
    dy = torch.randn(b, l, h, p, generator=gen).to(dev, torch.bfloat16)
    assert triton_op.tma_ok(x, dy, B, C), "descriptors not allowed here"
    for bi, cfg in enumerate(BWD_CONFIGS):
        if not bwd_config_fits(cfg, p, n):
            continue
        out = {}
        for tma in (False, True, True):
            ls = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in leaves]
            kws = dict(kw)
            names = [k for k, v in kw.items() if isinstance(v, torch.Tensor)]
            for k, t in zip(names, ls[5:]):
                kws[k] = t
            with force_config(bwd=bi, seg=256, tma=tma, split=True if mode == "both-split" else None):
                y = bi_ssd_triton(*ls[:5], **kws)
                gr = torch.autograd.grad(y, ls, dy)
            out.setdefault(tma, []).append([y] + list(gr))
        cases += 1
        ref = out[False][0]
        diffs = []
        for run in out[True]:
            for i, (a, c) in enumerate(zip(ref, run)):
                if not torch.isfinite(a).all():
                    diffs.append(f"{i}: non-finite reference")
                elif not torch.equal(a, c):
                    diffs.append(f"{i}: max diff {(a.float() - c.float()).abs().max().item():.3g}")
        bad += bool(diffs)
        print(f"p{p} n{n} h{h} g{g} {mode:10s} cfg {bi} (Q {cfg.kwargs['BLOCK_Q']}, {cfg.num_warps} warps, "
              f"{cfg.num_stages} stages): {'equal' if not diffs else diffs}", flush=True)
print("ALL EQUAL" if not bad else f"{bad} of {cases} cases DIFFER", f"({cases} cases)")
