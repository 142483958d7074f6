"""The backward's dot-precision policy, checked on CPU with tensor-core tf32 (and bf16) emulated in the Triton interpreter.

On an H200, plain tf32 dots made dA and d(dt_bias) miss the fp32 bar (2e-3 relative) already at b16 L400
(dA 4.9e-3); the kernels therefore run the dots that feed the log-decay gradients and the states in tf32x3 and
only the rest in tf32 (``autograd._dot_precisions``). Here the same inputs as the GPU suite (bf16-representable
values, Mamba2 ranges) run under emulated tf32 / tf32x3: with the policy every output meets the fp32 bar; with
every dot in plain tf32, dA does not. So a change of the policy that would fail on the GPU fails here first.

bf16 inputs get their own policy (bf16 dots, and state dots split into two bf16 parts): the interpreter cannot run
bf16 tensors, so the kernels emulate a bf16 dot there (operands rounded to bf16 on their bits, fp32 products and
accumulation); the policy runs here on fp32 inputs whose values are bf16 values, as the GPU's bf16 inputs are.
"""
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from yolo_bimamba.ops import bi_ssd  # noqa: E402
from yolo_bimamba.ops.bi_ssd import autograd, tuning  # noqa: E402
from yolo_bimamba.ops.bi_ssd.tuning import BWD_CONFIGS, STATE_CONFIGS, force_config  # noqa: E402


from bf16_split_check import bf16_split_case, check_bf16_split  # noqa: E402
from tf32_emulation import emulate_tf32, to_tf32  # noqa: E402

if torch.cuda.is_available() or not tuning._INTERPRET:
    pytest.skip("tf32 is emulated in the Triton interpreter only (CPU)", allow_module_level=True)

BAR = 2e-3  # the fp32 bar of the GPU suite (tf32 dots allowed)


def _inputs(b=2, l=400, h=4, p=64, n=64, seed=1):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=gen) * scale + shift).to(torch.bfloat16).float()

    dt0 = torch.exp(torch.rand(h, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    inp = dict(x=rnd(b, l, h, p), dt=rnd(b, l, h, scale=0.5, shift=-0.5),
               A=-torch.exp(torch.rand(h, generator=gen) * math.log(16.0)), B=rnd(b, l, 1, n), C=rnd(b, l, 1, n),
               D=rnd(h), dt_bias=dt0 + torch.log(-torch.expm1(-dt0)))
    return inp, rnd(b, l, h, p)


def _grads(inp, dy, backend, dtype):
    leaves = {k: v.detach().to(dtype).requires_grad_() for k, v in inp.items()}
    y = bi_ssd(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], D=leaves["D"],
               dt_bias=leaves["dt_bias"], dt_softplus=True, backend=backend)
    gs = torch.autograd.grad(y, list(leaves.values()), dy.to(dtype))
    return {"y": y.detach(), **{"d" + k: g for k, g in zip(leaves, gs)}}


def _errors(out, ref):
    return {k: ((out[k].double() - ref[k]).norm() / ref[k].norm()).item() for k in ref}


def test_tf32_rounding_helper():
    v = torch.tensor([1.0 + 2.0 ** -11, 1.0 + 2.0 ** -10 + 2.0 ** -12, -3.0e-5], dtype=torch.float32).numpy()
    r = to_tf32(v)
    assert r[0] == 1.0 + 2.0 ** -10  # a tie rounds away from zero in magnitude
    assert r[1] == 1.0 + 2.0 ** -10
    assert abs(r[2] - v[2]) <= abs(v[2]) * 2.0 ** -11


@pytest.mark.slow  # emulated tensor-core precision, minutes in all; .ci/run runs the slow tier
def test_backward_precision_policy_meets_the_fp32_bar_under_emulated_tf32():
    inp, dy = _inputs()
    ref = _grads(inp, dy, "torch", torch.float64)
    with emulate_tf32(), force_config(fwd=2, bwd=0, state=2):
        policy = _errors(_grads(inp, dy, "triton", torch.float32), ref)
        original = autograd._dot_precisions
        autograd._dot_precisions = lambda x: dict.fromkeys(autograd.DOT_CLASSES, "tf32")
        try:
            all_tf32 = _errors(_grads(inp, dy, "triton", torch.float32), ref)
        finally:
            autograd._dot_precisions = original
    bad = {k: v for k, v in policy.items() if not v <= BAR}
    assert not bad, f"with the policy, above {BAR}: {bad} (all: {policy})"
    # the emulation has teeth: every dot in plain tf32 loses dA (as measured on the H200)
    assert all_tf32["dA"] > BAR and all_tf32["dA"] > 50 * policy["dA"], all_tf32


def test_bf16_rounding_and_split():
    check_bf16_split(*bf16_split_case("cpu"))


_BF16_POLICY = dict(DOT_ST="bf16x3a", DOT_RD="bf16x3b", DOT_MID="bf16", DOT_IN="bf16", DOT_LO="bf16")


@pytest.mark.slow  # emulated tensor-core precision, minutes in all; .ci/run runs the slow tier
def test_bf16_policy_under_emulated_bf16():
    """The bf16 inputs' policy: every output well inside the bf16 bar (1.5e-2) and dA / d(dt_bias) at fp32
    accuracy; with the state dots in plain bf16 instead of split, dA is about 1000 times less accurate."""
    assert autograd._dot_precisions(torch.zeros(1, dtype=torch.bfloat16)) == _BF16_POLICY
    inp, dy = _inputs()
    ref = _grads(inp, dy, "torch", torch.float64)
    original = autograd._dot_precisions
    try:
        # segments of 128 rows: the backward's state kernel runs with the policy too
        with emulate_tf32(), force_config(fwd=2, bwd=0, state=2, seg=128):
            autograd._dot_precisions = lambda x: _BF16_POLICY
            policy = _errors(_grads(inp, dy, "triton", torch.float32), ref)
            autograd._dot_precisions = lambda x: dict(_BF16_POLICY, DOT_ST="bf16", DOT_RD="bf16")
            plain = _errors(_grads(inp, dy, "triton", torch.float32), ref)
    finally:
        autograd._dot_precisions = original
    bad = {k: v for k, v in policy.items() if not v <= 4e-3}
    assert not bad, f"bf16 policy above 4e-3: {bad} (all: {policy})"
    assert policy["dA"] <= 5e-5 and policy["ddt_bias"] <= 2e-3, policy
    assert plain["dA"] > 300 * policy["dA"], (plain, policy)


@pytest.mark.slow  # emulated tensor-core precision, minutes in all; .ci/run runs the slow tier
@pytest.mark.parametrize("bi", range(1, len(BWD_CONFIGS)))
def test_bf16_policy_every_other_bwd_config(bi):
    """The bf16 policy's dots (split and plain bf16) under every other backward config, with the state kernel's other
    configs too: the test above runs the default configs only."""
    inp, dy = _inputs()
    ref = _grads(inp, dy, "torch", torch.float64)
    original = autograd._dot_precisions
    try:
        with emulate_tf32(), force_config(fwd=2, bwd=bi, state=bi % len(STATE_CONFIGS), seg=128):
            autograd._dot_precisions = lambda x: _BF16_POLICY
            errs = _errors(_grads(inp, dy, "triton", torch.float32), ref)
    finally:
        autograd._dot_precisions = original
    bad = {k: v for k, v in errs.items() if not v <= 4e-3}
    assert not bad and errs["dA"] <= 5e-5, errs


_FP16_POLICY = dict(DOT_ST="tf32x3", DOT_RD="tf32x3", DOT_MID="tf32", DOT_IN="tf32", DOT_LO="tf32")


def _fp16_run(inp, dy, policy=None):
    leaves = {k: v.detach().to(torch.float16 if k in ("x", "dt", "B", "C") else torch.float32).requires_grad_()
              for k, v in inp.items()}
    original = autograd._dot_precisions
    try:
        if policy is not None:
            autograd._dot_precisions = lambda x: policy
        with emulate_tf32(), force_config(fwd=2, bwd=0, state=2):
            y = bi_ssd(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], D=leaves["D"],
                       dt_bias=leaves["dt_bias"], dt_softplus=True, backend="triton")
            gs = torch.autograd.grad(y, list(leaves.values()), dy.to(torch.float16))
    finally:
        autograd._dot_precisions = original
    assert y.dtype == torch.float16
    return {"y": y, **{"d" + k: g for k, g in zip(leaves, gs)}}


@pytest.mark.slow  # emulated tensor-core precision, minutes in all; .ci/run runs the slow tier
def test_fp16_inputs_under_emulated_tensor_cores():
    """fp16 inputs (fp16 AMP) run their own policy (tf32x3 state dots, tf32 for the rest): fp16 tensors run in the
    interpreter, so the whole fp16 path is checked here against the fp16 bar of the GPU suite (5e-3), with dA at
    fp32 accuracy; with the state dots in plain tf32, dA is far less accurate."""
    assert autograd._dot_precisions(torch.zeros(1, dtype=torch.float16)) == _FP16_POLICY
    inp, dy = _inputs()
    ref = _grads(inp, dy, "torch", torch.float64)
    errs = _errors(_fp16_run(inp, dy), ref)
    bad = {k: v for k, v in errs.items() if not v <= 5e-3}
    assert not bad, f"fp16 above 5e-3: {bad} (all: {errs})"
    assert errs["dA"] <= 5e-5, errs
    plain = _errors(_fp16_run(inp, dy, dict(_FP16_POLICY, DOT_ST="tf32", DOT_RD="tf32")), ref)
    assert plain["dA"] > 20 * errs["dA"], (plain, errs)

