import os, sys, time
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
sys.path.insert(0, "tests")
from stress_recipes import STRESS
from yolo_bimamba.ops import bi_ssd, triton_op
L = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
b, h, p, n = 1, 2, 32, 32
gen = torch.Generator().manual_seed(0)
bf = lambda t: t.to(torch.bfloat16).float()
x = bf(torch.randn(b, L, h, p, generator=gen)); dy = bf(torch.randn(b, L, h, p, generator=gen))
B = bf(torch.randn(b, L, 1, n, generator=gen)); C = bf(torch.randn(b, L, 1, n, generator=gen))
dt = STRESS["softplus-input-10"]["dt_raw"](gen, (b, L, h))
A = -torch.tensor([0.5, 4.0]); D = torch.ones(h); bias = torch.zeros(h)
def grads(backend, dtype, policy=None):
    leaves = [t.clone().to(dtype).requires_grad_() for t in (x, dt, A, B, C, D, bias)]
    orig = triton_op._dot_precisions
    if policy: triton_op._dot_precisions = lambda t: dict(zip(triton_op.DOT_CLASSES, policy.split(",")))
    try:
        y = bi_ssd(*leaves[:5], D=leaves[5], dt_bias=leaves[6], dt_softplus=True, backend=backend)
        g = torch.autograd.grad(y, leaves, dy.to(dtype))
    finally:
        triton_op._dot_precisions = orig
    return dict(zip(["dx", "ddt", "dA", "dB", "dC", "dD", "dbias"], g))
ref = grads("torch", torch.float64)
for pol in ["bf16x3a,bf16x3b,bf16,bf16,bf16", "bf16x3a,bf16,bf16,bf16,bf16", "bf16x3a,bf16x3a,bf16,bf16,bf16"]:
    t0 = time.time(); out = grads("triton", torch.float32, pol)
    err = {k: f"{((out[k].double() - ref[k]).norm() / ref[k].norm()).item():.2e}" for k in ref}
    print(L, pol, err, f"{time.time()-t0:.0f}s", flush=True)
