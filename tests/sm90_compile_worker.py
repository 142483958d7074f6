"""The sm_90 compile worker of test_compile_sm90.py, run as a script in a subprocess without TRITON_INTERPRET:
``python tests/sm90_compile_worker.py --out FILE [--dtypes fp32,bf16] [--manual-signature]`` records every
kernel launch of the ops (each autotune config once), compiles each for sm_90 in parallel and writes a JSON
report. test_compile_sm90.py says what is compiled and why."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ["fp32", "bf16"]


# =============================================================================================
# worker (runs in a subprocess: python tests/sm90_compile_worker.py --out FILE)
# =============================================================================================

# (label, headdim, d_state, ngroups, nheads, op kwargs, dtypes, last stage)
#
# Tier 1 ("cubin": all the way through ptxas, fp32 and bf16): the problem families that set the
# tile sizes and shared memory (headdim x d_state 64x64 = detection, 64x128 = LM, 128x128 = the
# largest supported for fp32 and 16-bit inputs), in the default bidirectional mode; at 64x64 also with the backward's two directions in
# two launches (force_config(split=True)) instead of one.
# At 32x32 (the detection models' layers) the backward loads differently (see the variant), so it is compiled there
# too, to a cubin in bf16 (what AMP training runs).
# Tier 2 ("ptx": front end, layouts and shared-memory allocation, no ptxas; one dtype each, to
# keep this test within its CI budget): the other code paths of the same kernels (Hydra shift with
# separate backward inputs, shift with shared inputs, one direction, ngroups > 1, D per channel,
# dt_limit, no dt_bias/softplus). In every measurement so far they needed no more shared memory
# than the tier-1 "both" mode of the same family.
def variants():
    both = dict(direction="both", D="h", dt_bias=True, dt_softplus=True)
    hydra = dict(direction="both", D=None, dt_bias=True, dt_softplus=True, shift=True, separate=True)
    fwd = dict(direction="forward", D="hp", dt_bias=False, dt_softplus=False, dt_limit=(0.001, 0.5))
    bwd = dict(direction="backward", D=None, dt_bias=True, dt_softplus=True)
    hydra_shared = dict(direction="both", D="hp", dt_bias=False, dt_softplus=True, shift=True)
    t1, t2 = "cubin", "ptx"
    return [
        ("p64n64-both", 64, 64, 1, 8, both, ("fp32", "bf16"), t1),
        ("p64n64-both-two-launches", 64, 64, 1, 8, dict(both, split=True), ("fp32", "bf16"), t1),
        # the segment kernel's ordered group rows (tickets, acquire / release counters; YOLO_BIMAMBA_ORDERED_ROWS=1)
        ("p64n64-both-ordered", 64, 64, 1, 8, dict(both, ordered=True), ("bf16",), t1),
        ("p64n128-both-ordered", 64, 128, 1, 8, dict(both, ordered=True), ("bf16",), t2),
        ("p64n128-both", 64, 128, 1, 8, both, ("fp32", "bf16"), t1),
        ("p128n128-both", 128, 128, 1, 4, both, ("fp32", "bf16"), t1),
        # 256 fits only for 16-bit inputs, with the other size at most 64 (ops.bi_ssd.api.triton_dims_supported)
        ("p64n256-both", 64, 256, 1, 8, both, ("bf16",), t2),
        ("p256n64-both", 256, 64, 1, 4, both, ("bf16",), t2),
        ("p64n64-hydra", 64, 64, 1, 8, hydra, ("bf16",), t2),
        # d_state 128: the forward pairs kernel walks a group's heads (GROUPED), here with both directions' own C B^T
        ("p64n128-hydra", 64, 128, 1, 8, hydra, ("bf16",), t2),
        # headdim x d_state 32 x 32 (the detection models' own layers): the backward segment kernel takes its other
        # way of loading there (every input of a chunk one chunk ahead, kernels_common.AHEAD_MAX_TILE)
        ("p32n32-both", 32, 32, 1, 8, both, ("bf16",), t1),
        ("p32n32-hydra", 32, 32, 1, 8, hydra, ("bf16",), t2),
        ("p64n64-shift-shared-g2", 64, 64, 2, 8, hydra_shared, ("fp32",), t2),
        ("p64n64-forward-g2", 64, 64, 2, 8, fwd, ("bf16",), t2),
        ("p64n64-backward", 64, 64, 1, 8, bwd, ("fp32",), t2),
    ]


def _torch_dtype(name):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}[name]


def _call_op(dtype_name, p, n, g, h, v):
    """Call bi_ssd_triton forward + backward on CPU tensors (kernels are recorded, not run)."""
    import torch

    from yolo_bimamba.ops.bi_ssd.autograd import bi_ssd_triton

    dt = _torch_dtype(dtype_name)
    b, l = 2, 1000  # L not a multiple of any tile; sizes matter only for integer specialisation
    mk = lambda *s, dtype=dt: torch.randn(*s, dtype=dtype).requires_grad_(True)  # noqa: E731
    x, dtt, B, C = mk(b, l, h, p), mk(b, l, h), mk(b, l, g, n), mk(b, l, g, n)
    A = (-torch.rand(h)).requires_grad_(True)
    kw = dict(chunk_size=64, dt_softplus=v["dt_softplus"], direction=v["direction"], shift=v.get("shift", False))
    if "dt_limit" in v:
        kw["dt_limit"] = v["dt_limit"]
    if v["D"] == "h":
        kw["D"] = torch.randn(h).requires_grad_(True)
    elif v["D"] == "hp":
        kw["D"] = torch.randn(h, p).requires_grad_(True)
    if v["dt_bias"]:
        kw["dt_bias"] = torch.randn(h).requires_grad_(True)
    if v.get("separate"):
        kw.update(dt_bwd=mk(b, l, h), B_bwd=mk(b, l, g, n), C_bwd=mk(b, l, g, n))
    from yolo_bimamba.ops.bi_ssd.tuning import force_config

    # segments of 256 rows (4 at L = 1000): the state kernel runs in every variant; "split" picks how the
    # backward runs both directions (two launches, the default, or one)
    from yolo_bimamba.ops.bi_ssd.tuning import BWD_CONFIGS, FWD_CONFIGS, bwd_config_fits

    # a segment kernel and its in-chunk pairs kernel cut the sequence into the same chunks (the forward's: and headdim
    # blocks): after the autotuned run, again with each forward config and a backward config of each BLOCK_Q forced,
    # so that the pairs kernels are compiled for every tile (kernels recorded already are not recorded twice)
    per_q = {}
    for i, cfg in enumerate(BWD_CONFIGS):
        if bwd_config_fits(cfg, p, n):
            per_q.setdefault(cfg.kwargs["BLOCK_Q"], i)
    fwds, bwds = list(range(len(FWD_CONFIGS))), list(per_q.values())
    runs = [(None, None)] + [(fwds[i % len(fwds)], bwds[i % len(bwds)]) for i in range(max(len(fwds), len(bwds)))]
    for fwd, bwd in runs:
        with force_config(seg=256, split=v.get("split"), ordered=v.get("ordered"), fwd=fwd, bwd=bwd):
            y = bi_ssd_triton(x, dtt, A, B, C, **kw)
            leaves = [t for t in [x, dtt, A, B, C, *kw.values()] if isinstance(t, torch.Tensor)]
            torch.autograd.grad(y, leaves, torch.randn_like(y))


def _call_dwconv(dtype_name):
    """The fused conv1d + SiLU (ops.dwconv), forward and backward, once per config (fp32 weights, as under AMP)."""
    import torch

    from yolo_bimamba.ops.dwconv import dwconv_silu, force_config
    from yolo_bimamba.ops.dwconv_kernels import CONFIGS

    for i in range(len(CONFIGS)):
        u = torch.randn(2, 100, 96, dtype=_torch_dtype(dtype_name)).requires_grad_(True)
        w, b = torch.randn(96, 1, 7).requires_grad_(True), torch.randn(96).requires_grad_(True)
        with force_config(i):
            y = dwconv_silu(u, w, b, backend="triton")
            torch.autograd.grad(y, (u, w, b), torch.randn_like(y))


def _call_gated_norm(dtype_name):
    """The fused gated RMSNorm (ops.gated_norm), forward and backward, once per config, at a narrow and at the
    widest channel count of the models (fewer rows per program there)."""
    import torch

    from yolo_bimamba.ops.gated_norm import force_config, gated_rmsnorm
    from yolo_bimamba.ops.gated_norm_kernels import CONFIGS

    for d in (64, 1024):
        for i in range(len(CONFIGS)):
            x, z = (torch.randn(2, 50, d, dtype=_torch_dtype(dtype_name)).requires_grad_(True) for _ in range(2))
            w = torch.ones(d).requires_grad_(True)
            with force_config(i):
                y = gated_rmsnorm(x, z, w, backend="triton")
                torch.autograd.grad(y, (x, z, w), torch.randn_like(y))


def _call_layer_norm(dtype_name):
    """The fused channels-first LayerNorm (ops.layer_norm), forward and backward, once per config, at the narrowest
    and at a wide channel count (fewer tokens per program there); fp32 weights, as under AMP."""
    import torch

    from yolo_bimamba.ops.layer_norm import force_config, layer_norm_channels_first
    from yolo_bimamba.ops.layer_norm_kernels import CONFIGS

    for c in (64, 1024):
        for i in range(len(CONFIGS)):
            x = torch.randn(2, c, 5, 7, dtype=_torch_dtype(dtype_name)).requires_grad_(True)
            w, b = torch.ones(c).requires_grad_(True), torch.zeros(c).requires_grad_(True)
            with force_config(i):
                y = layer_norm_channels_first(x, w, b, backend="triton")
                torch.autograd.grad(y, (x, w, b), torch.randn_like(y))


def _resource_usage(cubin: bytes):
    """(registers, stack bytes, local bytes) from cuobjdump, or None where it is not available."""
    import shutil
    import tempfile

    import triton

    cands = [Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump", shutil.which("cuobjdump")]
    exe = next((str(c) for c in cands if c and Path(c).exists()), None)
    if exe is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([exe, "--dump-resource-usage", f.name], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    import re

    m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", res.stdout)
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(4))


_JOBS: list = []  # filled by the recorder before the pool forks
_STOP_AT_PTX = [False]  # per job: skip ptxas (tier 2)


def _install_ptx_only_switch():
    from triton.backends.nvidia.compiler import CUDABackend

    orig = CUDABackend.add_stages

    def add_stages(self, stages, options, *rest, **kw):
        orig(self, stages, options, *rest, **kw)
        if _STOP_AT_PTX[0]:
            stages["cubin"] = lambda src, metadata: b""

    CUDABackend.add_stages = add_stages
PRUNED: list = []  # (kernel, variant, dtype, config) the autotuner prunes for that call


def _compile_job(i):
    import triton
    from triton.compiler import ASTSource

    job = _JOBS[i]
    rec = {k: job[k] for k in ("kernel", "variant", "dtype", "config", "config_index", "stage")}
    t0 = time.time()
    _STOP_AT_PTX[0] = job["stage"] == "ptx"
    try:
        src = ASTSource(job["fn"], job["signature"], job["constexprs"], job["attrs"])
        ck = triton.compile(src, target=job["target"], options=job["options"])
        md = ck.metadata
        rec.update(ok=True, shared=int(md.shared), num_warps=int(md.num_warps), num_stages=int(md.num_stages))
        ru = _resource_usage(ck.asm["cubin"]) if "cubin" in ck.asm else None
        if ru is not None:
            rec.update(regs=ru[0], stack=ru[1], local=ru[2])
        rec["has_cubin"] = "cubin" in ck.asm and len(ck.asm["cubin"]) > 0
        rec["has_ptx"] = "ptx" in ck.asm and ".entry" in ck.asm["ptx"]
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the test
        msg = f"{type(exc).__name__}: {exc}"
        rec.update(ok=False, error=msg[-3000:])
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


def _config_index(kernel_name, launch_kwargs):
    """Index of the config of ``kernel_name``'s autotuner in ops.bi_ssd.tuning whose meta-parameters, warps and stages are
    those of a direct launch (None for a kernel without an autotuner, or a launch that is none of its configs)."""
    from triton.runtime.autotuner import Autotuner

    from yolo_bimamba.ops.bi_ssd import tuning

    for attr in dir(tuning):
        tuner = getattr(tuning, attr)
        if not isinstance(tuner, Autotuner) or (getattr(tuner.fn, "__name__", None) or tuner.fn.fn.__name__) != kernel_name:
            continue
        for i, c in enumerate(tuner.configs):
            if all(launch_kwargs.get(k) == v for k, v in c.kwargs.items()) and \
                    launch_kwargs.get("num_warps") == c.num_warps and launch_kwargs.get("num_stages") == c.num_stages:
                return i
    return None


def _worker(out_path: str, dtypes: list[str], manual_signature: bool = False) -> None:
    import multiprocessing as mp

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime import jit as tjit
    from triton.runtime.autotuner import Autotuner

    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "worker must run without the interpreter"
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    ctx = {"variant": None, "dtype": None, "config": None, "config_index": None, "stage": "cubin"}
    seen = set()

    def describe(v):
        if hasattr(v, "data_ptr"):
            return f"tensor[{v.dtype}]"
        return repr(v)

    def bind_native(self, args, kwargs):
        # exactly what JITFunction.run does before compiling (triton >= 3.3)
        binder = tjit.create_function_from_signature(self.signature, self.params, backend)
        bound, spec, options = binder(*args, **kwargs)
        options, sig, constexprs, attrs = self._pack_args(backend, kwargs, bound, spec, options)
        return sig, constexprs, attrs, options.__dict__

    def bind_manual(self, args, kwargs):
        # fallback for Triton versions without those internals: same types, no alignment hints
        tmap = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64",
                "int32": "i32", "int64": "i64", "int8": "i8", "uint8": "u8", "bool": "u1"}
        names = [p.name for p in self.params]
        vals = dict(zip(names, args))
        opt_kw = {}
        for k, val in kwargs.items():
            if k in names:
                vals[k] = val
            else:
                opt_kw[k] = val
        for p in self.params:
            if p.name not in vals:
                vals[p.name] = p.default
        sig, constexprs = {}, {}
        for i, p in enumerate(self.params):
            val = vals[p.name]
            if p.is_constexpr or val is None:
                sig[p.name] = "constexpr"
                constexprs[(i,)] = val
            elif hasattr(val, "data_ptr"):
                sig[p.name] = "*" + tmap[str(val.dtype).replace("torch.", "")]
            elif isinstance(val, bool):
                sig[p.name] = "u1"
            elif isinstance(val, int):
                sig[p.name] = "i32" if -(2**31) <= val < 2**31 else "i64"
            elif isinstance(val, float):
                sig[p.name] = "fp32"
            else:
                raise TypeError(f"cannot type argument {p.name}={val!r}")
        options = backend.parse_options(opt_kw)
        return sig, constexprs, {}, options.__dict__

    def record_run(self, *args, grid=None, warmup=False, **kwargs):
        sig, constexprs, attrs, options = (bind_manual if manual_signature else bind_native)(self, args, kwargs)
        name = getattr(self, "__name__", None) or self.fn.__name__
        key = (name, ctx["dtype"], repr(sorted(sig.items())), repr(sorted(constexprs.items(), key=str)),
               repr(sorted(attrs.items(), key=str)), repr(sorted((k, repr(v)) for k, v in options.items())))
        if key in seen:
            return None
        seen.add(key)
        cfg, idx = ctx["config"], ctx["config_index"]
        if cfg is None:
            # a launch of one config without its autotuner (forced, or the op's second backward launch running the
            # first one's config): the config of the kernel's autotuner that its meta-parameters name, if any
            idx = _config_index(name, kwargs)
            cfg = {"launch": {k: describe(v) for k, v in kwargs.items()}}
        _JOBS.append(dict(fn=self, signature=sig, constexprs=constexprs, attrs=attrs, options=options, target=target,
                          kernel=name, variant=ctx["variant"], dtype=ctx["dtype"], config=cfg,
                          config_index=idx, stage=ctx["stage"]))
        return None

    def record_autotuned(self, *args, **kwargs):
        # honour the autotuner's own pruning: a config pruned for these arguments never runs
        keep = list(self.configs)
        prune = getattr(self, "early_config_prune", None)
        if prune:
            nargs = dict(zip(self.arg_names, args))
            keep = prune(self.configs, nargs, **{k: v for k, v in kwargs.items() if k not in ("grid", "warmup")})
        name = getattr(self.fn, "__name__", None) or self.fn.fn.__name__
        for i, cfg in enumerate(self.configs):
            if not any(cfg is c for c in keep):
                PRUNED.append(dict(kernel=name, variant=ctx["variant"], dtype=ctx["dtype"], config_index=i))
                continue
            ctx["config"] = {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
            ctx["config_index"] = i
            try:
                self.fn.run(*args, **kwargs, **cfg.all_kwargs())
            finally:
                ctx["config"] = ctx["config_index"] = None
        # the op launches its backward's in-chunk pairs kernel in the chunks (BLOCK_Q) of the config the segment
        # kernel ran: "chosen" here is the first config kept (_call_op forces one per BLOCK_Q as well)
        self.best_config = keep[0]
        return None

    tjit.JITFunction.run = record_run
    Autotuner.run = record_autotuned

    from yolo_bimamba.ops.bi_ssd import tuning

    autotuners = {}
    for attr in dir(tuning):
        obj = getattr(tuning, attr)
        if isinstance(obj, Autotuner):
            fn = obj.fn
            autotuners[getattr(fn, "__name__", None) or fn.fn.__name__] = len(obj.configs)

    # SM90_ONLY=label,label: a resource report of some variants only (a developer's shortcut, not used by the tests)
    only = [v for v in os.environ.get("SM90_ONLY", "").split(",") if v]
    t0 = time.time()
    for dtype in dtypes:
        for label, p, n, g, h, v, vdtypes, stage in variants():
            if dtype not in vdtypes or (only and label not in only):
                continue
            ctx["variant"], ctx["dtype"], ctx["stage"] = label, dtype, stage
            _call_op(dtype, p, n, g, h, v)
        ctx["variant"], ctx["dtype"], ctx["stage"] = "dwconv", dtype, "cubin"
        _call_dwconv(dtype)
        ctx["variant"] = "gated_norm"
        _call_gated_norm(dtype)
        ctx["variant"] = "layer_norm"
        _call_layer_norm(dtype)
    t_record = time.time() - t0
    _install_ptx_only_switch()
    # biggest jobs first (backward kernels, large tiles), so the pool ends evenly
    size = lambda j: sum(v for v in j["config"].get("kwargs", {}).values() if isinstance(v, int))  # noqa: E731
    _JOBS.sort(key=lambda j: (j["stage"] != "cubin", "bwd" not in j["kernel"], -size(j)))

    nproc = max(1, min(len(_JOBS), os.cpu_count() or 1))
    t0 = time.time()
    with mp.get_context("fork").Pool(nproc) as pool:
        results = pool.map(_compile_job, range(len(_JOBS)), chunksize=1)
    report = dict(
        triton=triton.__version__, target=str(target), manual_signature=manual_signature,
        autotuners=autotuners, record_seconds=round(t_record, 2), compile_seconds=round(time.time() - t0, 2),
        processes=nproc, results=results, pruned=PRUNED,
    )
    Path(out_path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--manual-signature", action="store_true")
    a = ap.parse_args()
    _worker(a.out, a.dtypes.split(","), manual_signature=a.manual_signature)
