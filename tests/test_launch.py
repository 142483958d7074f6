"""The direct kernel launch (yolo_bimamba.ops.launch): its cache key against Triton's own specialisation, the
argument order it hands to Triton's launcher, and CPU tensors going through Triton. The direct launch itself needs a
GPU: tests/gpu/test_gpu_kernels.py::test_direct_launch, with every direct launch of the GPU suite checked against
Triton's specialisation."""
import math

import pytest
import torch
import triton
import triton.language as tl

from yolo_bimamba import config
from yolo_bimamba.ops import launch as L
from yolo_bimamba.ops.bi_ssd import autograd


def _triton_binder(kernel):
    """Triton's own argument binder and specialiser for an sm_90 target (what JITFunction.run calls on a GPU)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime import jit as tjit

    jf = tjit.JITFunction(getattr(kernel, "fn", kernel))
    return jf, tjit.create_function_from_signature(jf.signature, jf.params, make_backend(GPUTarget("cuda", 90, 32)))


DT_KW = dict(DO_F=True, DO_B=True, SEPARATE=False, HAS_BIAS=True, SOFTPLUS=True, COMPUTE=tl.float32, BLOCK_Q=64)


def _dt_args(**over):
    x = torch.zeros(64)
    args = dict(dt=x, A=x, bias=x, dtb=x, ddt=x, ddtb=x, scr=x, part=x, L=160, h=8, lo=0.0, hi=math.inf)
    args.update(over)
    return tuple(args.values())


def _values():
    """Arguments that Triton may specialise differently: tensors of several dtypes at every offset up to 16 bytes,
    integers around 1, 16 and the 32- and 64-bit limits, floats."""
    tensors = [torch.zeros(64, dtype=dt)[off:] for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64)
               for off in range(9)]
    ints = [0, 1, 2, 3, 15, 16, 17, 32, 48, 1600, 6400, 65536, (1 << 31) - 16, (1 << 31) - 1, 1 << 31,
            (1 << 31) + 16, 1 << 32, (1 << 63) - 16, 1 << 63, -1, -16, -(1 << 31), -(1 << 31) - 16]
    floats = [0.0, 1.0, -2.5, 16.0, math.inf, 1e-30]
    return {"tensor": tensors, "int": ints, "float": floats}


@pytest.mark.parametrize("kind,pos", [("tensor", 0), ("tensor", 4), ("int", 8), ("int", 9), ("float", 10),
                                      ("float", 11)])
def test_key_is_never_coarser_than_triton_specialisation(kind, pos):
    """Two arguments with the same key must get the same specialisation from Triton, or a kept kernel compiled for
    one (say, for a 16-byte aligned pointer) would be launched for the other. Checked with Triton's own specialiser
    over values chosen to hit every case it distinguishes; the key tells apart what Triton does (it is not
    trivially fine: some distinct values share a key)."""
    jf, binder = _triton_binder(autograd._bi_ssd_bwd_dt_kernel)
    spec_of = {}
    for v in _values()[kind]:
        args = list(_dt_args())
        args[pos] = v
        spec = binder(*args, **DT_KW)[1][pos]
        key = L._arg_key(v)
        assert key is not L._Uncached
        assert spec_of.setdefault(key, spec) == spec, f"{kind} {v!r}: key {key} also given to specialisation " \
                                                      f"{spec_of[key]}, Triton says {spec}"
    specs = set(map(repr, spec_of.values()))
    assert len(spec_of) < len(_values()[kind]) or kind == "float", "every value got a key of its own"
    if kind != "float":
        assert len(specs) > 1, "the values do not exercise Triton's specialisation"


def test_key_marks_arguments_it_cannot_describe():
    assert L._arg_key(object()) is L._Uncached
    assert L._arg_key((1, 2)) is L._Uncached
    assert L._arg_key(None) is None and L._arg_key(True) is True and L._arg_key(False) is False


def test_tail_is_the_kernel_parameters_after_the_positional_ones_in_order():
    """Triton's launcher takes every parameter, the constexprs too, in the kernel's order: the kept tail must be that
    order whatever order the keyword arguments came in, with defaults for parameters not given."""
    jf, binder = _triton_binder(autograd._bi_ssd_bwd_dt_kernel)
    args = _dt_args()
    shuffled = dict(reversed(list(DT_KW.items())), num_warps=4)
    tail = L._tail(jf, len(args), shuffled)
    bound = binder(*args, **shuffled)[0]
    assert tail == tuple(bound.values())[len(args):]
    assert len(args) + len(tail) == len(jf.params)
    with pytest.raises(TypeError, match="BLOCK_Q"):
        L._tail(jf, len(args), {k: v for k, v in DT_KW.items() if k != "BLOCK_Q"})

    @triton.jit
    def with_default(a_ptr, n, K: tl.constexpr = 3, M: tl.constexpr = 5):
        pass

    jf2, binder2 = _triton_binder(with_default)
    assert L._tail(jf2, 2, {"M": 7}) == (3, 7) == tuple(binder2(torch.zeros(4), 4, M=7)[0].values())[2:]


@triton.jit
def _head_sum_kernel(src_ptr, dst_ptr, ROWS, R: tl.constexpr, N: tl.constexpr, BLOCK_R: tl.constexpr):
    """dst[r, k] = sum_j src[r, j * N + k]: a small kernel for the CPU path."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, N)
    m = (rows < ROWS)[:, None]
    acc = tl.zeros((BLOCK_R, N), dtype=tl.float32)
    for j in range(R):
        acc += tl.load(src_ptr + rows[:, None] * (R * N) + j * N + cols[None, :], mask=m, other=0.0)
    tl.store(dst_ptr + rows[:, None] * N + cols[None, :], acc, mask=m)


def test_cpu_tensors_go_through_triton_and_nothing_is_kept():
    """Off CUDA (the interpreter here) every launch goes through Triton and the result is the kernel's (a sum of
    per-head rows, against torch)."""
    b_l, h, n = 37, 4, 8
    src = torch.randn(b_l, h * n)
    dst = torch.full((b_l, n), math.nan)
    kept, before = len(L._kept), dict(L.counts)
    for _ in range(2):
        L.launch(_head_sum_kernel, (triton.cdiv(b_l, 16),), (src, dst, b_l), dict(R=h, N=n, BLOCK_R=16))
    assert L.counts["triton"] == before["triton"] + 2 and L.counts["direct"] == before["direct"]
    assert len(L._kept) == kept
    torch.testing.assert_close(dst, src.view(b_l, h, n).sum(1))


def test_direct_launch_switch_and_check_read_from_the_environment():
    import subprocess
    import sys

    code = "from yolo_bimamba import config; print(config.DIRECT_LAUNCH, config.CHECK_LAUNCH)"
    env = dict(__import__("os").environ, YOLO_BIMAMBA_DIRECT_LAUNCH="0", YOLO_BIMAMBA_CHECK_LAUNCH="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


def test_launch_hooks_send_launches_through_triton():
    """Triton's launch hooks (profilers) are called by its own launch path: with one set, nothing is launched
    directly. Triton >= 3.4 always has a hook chain, empty unless a hook was added."""
    rt = triton.knobs.runtime
    assert not L._hooks_set()
    calls = []
    rt.launch_enter_hook.add(calls.append) if hasattr(rt.launch_enter_hook, "add") else setattr(
        rt, "launch_enter_hook", calls.append)
    try:
        assert L._hooks_set()
    finally:
        if hasattr(rt.launch_enter_hook, "remove"):
            rt.launch_enter_hook.remove(calls.append)
        else:
            rt.launch_enter_hook = None
    assert not L._hooks_set()


class _FakeKernel:
    """What a compiled kernel offers the direct launch: run (Triton's launcher), function, packed_metadata."""

    function = "cu-function"
    packed_metadata = ("meta",)

    def __init__(self):
        self.runs = []

    def run(self, *a):
        self.runs.append(a)


class _FakeJit:
    """A JIT function's launch interface: fn[grid](*args, **kwargs) returns the compiled kernel (and counts)."""

    def __init__(self, kernel_fn):
        self.inner, _ = _triton_binder(kernel_fn)
        self.params, self.__name__ = self.inner.params, "fake"
        self.compiled = []

    def __getitem__(self, grid):
        def go(*args, **kwargs):
            k = _FakeKernel()
            self.compiled.append((grid, args, kwargs, k))
            return k
        return go


def test_direct_launch_logic_with_a_cuda_stand_in(monkeypatch):
    """The cache's logic off the GPU: CUDA tensors stood in for (is_cuda reports True), Triton's JIT function and
    launcher replaced by recorders. The first launch of a specialisation goes through Triton; the next ones call the
    kept kernel's launcher with the grid, the stream, the kernel's function and metadata, no hooks, every positional
    argument and then the remaining parameters in the kernel's order; a new alignment, integer class or constexpr
    goes through Triton again; a launch hook sends everything through Triton. The GPU suite runs the real thing."""

    class CudaStandIn(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 1234, raising=False)
    monkeypatch.setattr(config, "DIRECT_LAUNCH", True)
    monkeypatch.setattr(config, "CHECK_LAUNCH", False)
    fn = _FakeJit(autograd._bi_ssd_bwd_dt_kernel)
    buf = torch.zeros(80)
    x = buf[:64].as_subclass(CudaStandIn)
    args = _dt_args(**{k: x for k in ("dt", "A", "bias", "dtb", "ddt", "ddtb", "scr", "part")})
    kw = dict(DT_KW, num_warps=4)

    first = L.launch(fn, (5, 2), args, kw)
    assert len(fn.compiled) == 1 and fn.compiled[0][0] == (5, 2) and not first.runs
    for _ in range(2):
        assert L.launch(fn, (5, 2), args, kw) is first
    assert len(fn.compiled) == 1 and len(first.runs) == 2
    tail = tuple(kw[p.name] for p in fn.params[len(args):])
    assert first.runs[0] == (5, 2, 1, 1234, "cu-function", ("meta",), None, None, None, *args, *tail)

    # what Triton specialises differently gets its own kernel, through Triton
    shifted = buf[1:65].as_subclass(CudaStandIn)
    L.launch(fn, (5, 2), (shifted,) + args[1:], kw)
    L.launch(fn, (5, 2), args[:8] + (17,) + args[9:], kw)
    L.launch(fn, (5, 2), args, dict(kw, BLOCK_Q=32))
    assert len(fn.compiled) == 4

    # a launch hook: through Triton, every time
    rt = triton.knobs.runtime
    hook = lambda *a: None  # noqa: E731
    rt.launch_enter_hook.add(hook)
    try:
        L.launch(fn, (5, 2), args, kw)
    finally:
        rt.launch_enter_hook.remove(hook)
    assert len(fn.compiled) == 5 and len(first.runs) == 2

    # an argument the key cannot describe: never kept
    L.launch(fn, (5, 2), args[:10] + ((1, 2),) + args[11:], kw)
    L.launch(fn, (5, 2), args[:10] + ((1, 2),) + args[11:], kw)
    assert len(fn.compiled) == 7


@pytest.mark.parametrize("maxnreg", [None, 128])
def test_a_config_launches_with_its_warps_stages_and_register_cap(monkeypatch, maxnreg):
    """A config launched by the op itself (forced, default or cached: not through the autotuner) carries every launch
    option of the config; a register cap (maxnreg) left out would compile another kernel than the autotuner timed."""
    seen = []
    monkeypatch.setattr(autograd, "launch", lambda fn, grid, args, kwargs: seen.append((fn, grid, args, kwargs)))
    cfg = triton.Config({"BLOCK_Q": 32}, num_warps=8, num_stages=2, maxnreg=maxnreg)
    autograd._run_config("kernel", lambda meta: (meta["BLOCK_Q"], 3), ("a",), {"P": 64}, cfg)
    [(fn, grid, args, kwargs)] = seen
    assert (fn, grid, args) == ("kernel", (32, 3), ("a",))
    want = {"P": 64, "BLOCK_Q": 32, "num_warps": 8, "num_stages": 2}
    if maxnreg is not None:
        want["maxnreg"] = maxnreg
    assert kwargs == want
