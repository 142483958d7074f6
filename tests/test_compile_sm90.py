"""Compile every Triton kernel x every autotune config for a real GPU target (CUDA sm_90, H100/H200).

Runs on a CPU-only machine: ``triton.compile`` with ``GPUTarget("cuda", 90, 32)`` goes all the way
to a cubin (ptxas ships in the Triton wheel), so a config that the GPU compiler rejects (tl.dot
tiles under the minimum size, invalid layouts, ptxas errors), needs more shared memory than a
Hopper block may use (227 KiB), or more registers than the block's warps can get, fails here in
CI instead of on a user's GPU.

How the kernels and their exact launch arguments are found: a subprocess (no TRITON_INTERPRET,
so ``@triton.jit`` gives real JIT functions) calls the public op ``bi_ssd_triton`` forward and
backward on CPU tensors, with ``JITFunction.run`` and ``Autotuner.run`` replaced by a recorder: each
launch is bound and specialised exactly as Triton's launcher does, for the sm_90 backend, and an
autotuned launch is recorded once per config of the autotuner. Nothing runs on the CPU; the
recorded (kernel, signature, constexprs, options) are then compiled in parallel. The op is called
in several modes (both / forward / backward, Hydra shift with separate backward inputs, D per
head or per channel, ngroups > 1, with and without dt_bias/softplus) and problem families
(headdim x d_state = 64x64, 64x128, 128x128), for fp32 and bf16 inputs.

If anything in this chain is missing (no Triton, no NVIDIA backend, no ptxas, a changed Triton
API), the tests fail; they are never skipped. The tests that need the compile worker are marked ``exhaustive``:
the README's ``pytest`` leaves them out (they take minutes on a 2-core machine), ``pytest -m exhaustive`` runs them,
and ``.ci/run`` runs both.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sm90_compile_worker import DTYPES, variants  # the worker's module: the op calls it compiles

ROOT = Path(__file__).resolve().parents[1]
SM90_MAX_SHARED = 232448  # bytes a block may use on sm_90 with the opt-in (227 KiB)
SM90_REGS_PER_SM = 65536
# the worker compiles every kernel x config x variant for sm_90 (about 490 s alone on the 2-core CI machine, 567 s
# with other work on the machine; 964 s in a fresh-clone CI run): the limit only guards against a hang
TIMEOUT_S = 2400


# =============================================================================================
# tests (run in pytest, CPU)
# =============================================================================================

def _discover():
    """(kernel name, number of configs) of every autotuned kernel of the op, read at collection."""
    from triton.runtime.autotuner import Autotuner

    from yolo_bimamba.ops.bi_ssd import tuning

    out = []
    for attr in sorted(dir(tuning)):
        obj = getattr(tuning, attr)
        if isinstance(obj, Autotuner):
            fn = obj.fn
            out.append((getattr(fn, "__name__", None) or fn.fn.__name__, len(obj.configs)))
    return out


try:
    _KERNELS = _discover()
    _DISCOVERY_ERROR = None
except Exception as _exc:  # noqa: BLE001 - turned into a failing test, never a skip
    _KERNELS, _DISCOVERY_ERROR = [], _exc

_PARAMS = [(d, k, i) for d in DTYPES for k, nc in _KERNELS for i in range(nc)]


def _run_worker(tmp_path_factory, manual=False, dtypes=DTYPES):
    out = tmp_path_factory.mktemp("sm90") / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(out.parent / "triton-cache")  # compile for real, every run
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    worker = Path(__file__).resolve().with_name("sm90_compile_worker.py")
    cmd = [sys.executable, str(worker), "--out", str(out), "--dtypes", ",".join(dtypes)]
    if manual:
        cmd.append("--manual-signature")
    res = subprocess.run(cmd, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if res.returncode != 0 or not out.exists():
        pytest.fail(f"sm_90 compile worker failed (rc {res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-6000:]}")
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    rep = _run_worker(tmp_path_factory)
    # a readable summary in the test log (pytest -s or on failure)
    print(f"\ntriton {rep['triton']} target {rep['target']}: {len(rep['results'])} compiles, "
          f"record {rep['record_seconds']} s, compile {rep['compile_seconds']} s on {rep['processes']} processes")
    for r in rep["results"]:
        if r["ok"]:
            print(f"  {r['dtype']} {r['variant']:24s} {r['kernel']} cfg{r['config_index']} {r['stage']:5s} shared {r['shared']:6d} B "
                  f"regs {r.get('regs', '?')} local {r.get('local', '?')} B  {r['seconds']} s")
    return rep


def test_discovered_kernels():
    if _DISCOVERY_ERROR is not None:
        raise _DISCOVERY_ERROR
    names = {k for k, _ in _KERNELS}
    assert len(_KERNELS) >= 2, f"expected the forward and backward autotuned kernels, found {_KERNELS}"
    assert all(nc >= 1 for _, nc in _KERNELS)
    assert len(names) == len(_KERNELS)


def _fmt(r):
    return f"{r['dtype']} {r['variant']} {r['kernel']} config {r['config_index']} {r['config']}"


@pytest.mark.exhaustive  # the compile worker: minutes on 2 cores (pytest -m exhaustive; .ci/run runs it)
@pytest.mark.parametrize("dtype,kernel,cfg", _PARAMS, ids=[f"{d}-{k}-cfg{i}" for d, k, i in _PARAMS])
def test_config_compiles_for_sm90(report, dtype, kernel, cfg):
    rows = [r for r in report["results"] if r["dtype"] == dtype and r["kernel"] == kernel and r["config_index"] == cfg]
    variants = {r["variant"] for r in rows}
    launched = {r["variant"] for r in report["results"] if r["kernel"] == kernel and r["dtype"] == dtype}
    launched -= {r["variant"] for r in report["pruned"]
                 if r["kernel"] == kernel and r["dtype"] == dtype and r["config_index"] == cfg}
    assert rows, f"{kernel} config {cfg} was never compiled for {dtype} (pruned for every problem size?)"
    assert variants == launched, f"{kernel} config {cfg} missing in variants {sorted(launched - variants)}"
    problems = []
    for r in rows:
        if not r["ok"]:
            problems.append(f"{_fmt(r)}: does not compile for sm_90:\n{r['error']}")
            continue
        if r["stage"] == "cubin" and not r.get("has_cubin"):
            problems.append(f"{_fmt(r)}: no cubin produced")
        if not r.get("has_ptx"):
            problems.append(f"{_fmt(r)}: no PTX entry produced")
        if r["shared"] > SM90_MAX_SHARED:
            problems.append(f"{_fmt(r)}: needs {r['shared']} B of shared memory > {SM90_MAX_SHARED} B (sm_90 limit)")
        if "regs" in r:
            per_thread = -(-r["regs"] // 8) * 8
            if per_thread * 32 * r["num_warps"] > SM90_REGS_PER_SM:
                problems.append(f"{_fmt(r)}: {r['regs']} registers x {r['num_warps']} warps exceed {SM90_REGS_PER_SM}")
    assert not problems, "\n".join(problems)


@pytest.mark.exhaustive  # the compile worker: minutes on 2 cores (pytest -m exhaustive; .ci/run runs it)
def test_every_launched_kernel_is_covered(report):
    """Kernels launched without an autotuner (if any) must compile too, and every variant ran."""
    known = {k for k, _ in _KERNELS}
    bad = [f"{_fmt(r)}: {r.get('error', '')}" for r in report["results"]
           if r["kernel"] not in known and not (r["ok"] and r["shared"] <= SM90_MAX_SHARED)]
    assert not bad, "\n".join(bad)
    seen = {(r["dtype"], r["variant"]) for r in report["results"]}
    want = {(d, v[0]) for v in variants() for d in v[6]}
    assert want <= seen, f"op calls that launched no kernel: {sorted(want - seen)}"
    for k, nc in _KERNELS:
        got = {r["config_index"] for r in report["results"] if r["kernel"] == k}
        assert got == set(range(nc)), f"{k}: compiled configs {sorted(got)} of {nc}"


def _assert_fits_sm90(rows):
    """Every compile of ``rows`` reached a cubin within sm_90's shared memory and registers per SM."""
    problems = [f"{_fmt(r)}: {r.get('error', 'no cubin')}" for r in rows if not (r["ok"] and r.get("has_cubin"))]
    problems += [f"{_fmt(r)}: shared {r['shared']}" for r in rows if r["ok"] and r["shared"] > SM90_MAX_SHARED]
    problems += [f"{_fmt(r)}: {r['regs']} registers x {r['num_warps']} warps" for r in rows
                 if r.get("regs") and -(-r["regs"] // 8) * 8 * 32 * r["num_warps"] > SM90_REGS_PER_SM]
    assert not problems, "\n".join(problems)


@pytest.mark.exhaustive  # the compile worker: minutes on 2 cores (pytest -m exhaustive; .ci/run runs it)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dwconv_kernels_compile_for_sm90(report, dtype):
    """The conv1d + SiLU kernels (launched without an autotuner): every config, all the way to a cubin."""
    from yolo_bimamba.ops.dwconv_kernels import CONFIGS

    rows = [r for r in report["results"] if r["variant"] == "dwconv" and r["dtype"] == dtype]
    kernels = {"_dwconv_silu_fwd", "_dwconv_silu_bwd_pre", "_dwconv_silu_bwd_in"}
    assert {r["kernel"] for r in rows} == kernels
    for k in kernels:
        tiles = {(r["config"]["launch"]["BLOCK_L"], r["config"]["launch"]["BLOCK_C"]) for r in rows if r["kernel"] == k}
        assert tiles == {(repr(bl), repr(bc)) for bl, bc, _ in CONFIGS}, (k, tiles)
    _assert_fits_sm90(rows)


def _assert_norm_kernels(report, dtype, variant, kernels, tile_names, configs, max_tile):
    """A norm's kernels (launched without an autotuner): every config, at widths 64 and 1024 (the rows per program
    capped by max_tile), compiled to a cubin that fits sm_90."""
    rows = [r for r in report["results"] if r["variant"] == variant and r["dtype"] == dtype]
    assert {r["kernel"] for r in rows} == kernels
    for k in kernels:
        tiles = {tuple(r["config"]["launch"][t] for t in tile_names) for r in rows if r["kernel"] == k}
        want = {(repr(max(1, min(n, max_tile // w))), repr(w)) for n, _ in configs for w in (64, 1024)}
        assert tiles == want, (k, tiles)
    _assert_fits_sm90(rows)


@pytest.mark.exhaustive  # the compile worker: minutes on 2 cores (pytest -m exhaustive; .ci/run runs it)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_norm_kernels_compile_for_sm90(report, dtype):
    """The gated RMSNorm kernels: every config at d = 64 and 1024."""
    from yolo_bimamba.ops.gated_norm import MAX_TILE
    from yolo_bimamba.ops.gated_norm_kernels import CONFIGS

    _assert_norm_kernels(report, dtype, "gated_norm", {"_gated_rmsnorm_fwd", "_gated_rmsnorm_bwd"},
                         ("BLOCK_R", "BLOCK_D"), CONFIGS, MAX_TILE)


@pytest.mark.exhaustive  # the compile worker: minutes on 2 cores (pytest -m exhaustive; .ci/run runs it)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_kernels_compile_for_sm90(report, dtype):
    """The channels-first LayerNorm kernels: every config at C = 64 and 1024."""
    from yolo_bimamba.ops.layer_norm import MAX_TILE
    from yolo_bimamba.ops.layer_norm_kernels import CONFIGS

    _assert_norm_kernels(report, dtype, "layer_norm", {"_layer_norm_cf_fwd", "_layer_norm_cf_bwd"},
                         ("BLOCK_L", "BLOCK_C"), CONFIGS, MAX_TILE)


def test_too_large_config_is_caught(tmp_path):
    """The check has teeth: a dot below the minimum tile and an oversized tile are rejected."""
    script = tmp_path / "toy.py"
    script.write_text(
        "import triton, triton.language as tl\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource\n"
        "@triton.jit\n"
        "def k(x_ptr, BM: tl.constexpr, BK: tl.constexpr):\n"
        "    a = tl.load(x_ptr + tl.arange(0, BM)[:, None] * BK + tl.arange(0, BK)[None, :])\n"
        "    acc = tl.dot(a, tl.trans(a))\n"
        "    for i in range(4):\n"
        "        acc += tl.dot(a, tl.trans(a))\n"
        "    tl.store(x_ptr + tl.arange(0, BM), tl.sum(acc, 1).to(tl.bfloat16))\n"
        "t = GPUTarget('cuda', 90, 32)\n"
        "def go(bm, bk):\n"
        "    try:\n"
        "        c = triton.compile(ASTSource(k, {'x_ptr': '*bf16', 'BM': 'constexpr', 'BK': 'constexpr'},\n"
        "                           {(1,): bm, (2,): bk}), target=t, options={'num_warps': 8})\n"
        "        return c.metadata.shared\n"
        "    except Exception as e:\n"
        "        return type(e).__name__\n"
        "print(go(64, 64), go(64, 8), go(256, 512))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ok, small, big = res.stdout.split()
    assert ok.isdigit() and int(ok) <= SM90_MAX_SHARED
    assert not small.isdigit(), "a bf16 dot with K=8 must not compile for sm_90"
    assert not big.isdigit() or int(big) > SM90_MAX_SHARED, "a 256x512 bf16 tile must exceed shared memory"
