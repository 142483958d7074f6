"""Speed and memory of the bidirectional SSD op: fused Triton kernels vs the alternatives.

    python benchmarks/bench_kernels.py                       # all shapes, bf16, writes benchmarks/out/
    python benchmarks/bench_kernels.py --out-dir DIR --quick  # fewer repeats

Cases (each fwd and fwd+bwd):
  triton          bi_ssd(direction="both", backend="triton")          the fused bidirectional op
  torch           bi_ssd(direction="both", backend="torch")           chunked PyTorch op
  triton_forward  bi_ssd(direction="forward", backend="triton")       one direction of our kernel
  naive_bi        two one-direction Triton runs with torch.flip        the naive bidirectional
  hydra_fused     bi_ssd(shift=True, dt_bwd=, B_bwd=, C_bwd=)          fused Hydra mode
  hydra_composed  published Hydra composition on our one-direction kernel: cat(x, flip(x)) along
                  the batch, causal scan, roll by one step, zero the first, flip the second half back

Timings (milliseconds, median over repeats):
  wall   ordinary launches as training runs them: groups of back-to-back calls timed on the host
         (synchronised before and after each group), per call;
  sync   one call between two synchronisations (latency of a single call, host work included);
  graph  GPU time: the call captured in a CUDA graph, replays timed with CUDA events
         (triton.testing.do_bench, return_mode="median").
Peak memory: torch.cuda.max_memory_allocated() during one call minus what was allocated before it
(inputs, upstream gradient). io = bytes of inputs + output (+ upstream gradient and input gradients
for fwd+bwd); mem_ratio = (inputs + peak above them) / io.

fwd runs with gradient-requiring inputs (as in training); fwd+bwd = forward + torch.autograd.grad
of every input. x, dt, B, C (and the Hydra backward ones) are in the benchmark dtype; A, D,
dt_bias are fp32 parameters, as in the modules. chunk_size 64 (the modules' default).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _enter_package_without_glue():
    """GPU machines may lack Ultralytics, which ``import yolo_bimamba`` registers with; the op does
    not need it, so enter the package without its __init__ there (subpackages import normally)."""
    import importlib.util
    import types

    if "yolo_bimamba" in sys.modules or importlib.util.find_spec("ultralytics") is not None:
        return
    spec = importlib.util.find_spec("yolo_bimamba")
    pkg = types.ModuleType("yolo_bimamba")
    pkg.__path__, pkg.__file__, pkg.__spec__ = list(spec.submodule_search_locations), spec.origin, spec
    sys.modules["yolo_bimamba"] = pkg


_enter_package_without_glue()
from yolo_bimamba.ops import bi_ssd  # noqa: E402

SHAPES = {
    "b16_L1600_h8": dict(b=16, l=1600, h=8, p=64, g=1, n=64),
    "b16_L400_h8": dict(b=16, l=400, h=8, p=64, g=1, n=64),
    "b16_L6400_h8": dict(b=16, l=6400, h=8, p=64, g=1, n=64),
    "b16_L1600_h4": dict(b=16, l=1600, h=4, p=64, g=1, n=64),
    "lm_b8_L8192_h32": dict(b=8, l=8192, h=32, p=64, g=1, n=128),
}
DETECTION = ["b16_L1600_h8", "b16_L400_h8", "b16_L6400_h8", "b16_L1600_h4"]
CASES = ["triton", "torch", "triton_forward", "naive_bi", "hydra_fused", "hydra_composed"]
HYDRA_CASES = ("hydra_fused", "hydra_composed")
LOWP = ("x", "dt", "B", "C", "dt_bwd", "B_bwd", "C_bwd")
CHUNK = 64


# ---------------------------------------------------------------------------------------------
# inputs and cases
# ---------------------------------------------------------------------------------------------

def make_inputs(s, dtype, device, hydra, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    b, l, h, p, g, n = s["b"], s["l"], s["h"], s["p"], s["g"], s["n"]

    def rnd(*shape, scale=1.0, shift=0.0, dt=dtype):
        return (torch.randn(*shape, generator=gen) * scale + shift).to(device=device, dtype=dt)

    dt0 = torch.exp(torch.rand(h, generator=gen) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    inp = dict(
        x=rnd(b, l, h, p), dt=rnd(b, l, h, scale=0.5, shift=-0.5),
        A=(-torch.exp(torch.rand(h, generator=gen) * math.log(16.0))).to(device),
        B=rnd(b, l, g, n), C=rnd(b, l, g, n), D=rnd(h, dt=torch.float32),
        dt_bias=(dt0 + torch.log(-torch.expm1(-dt0))).to(device),
    )
    if hydra:
        inp.update(dt_bwd=rnd(b, l, h, scale=0.5, shift=-0.5), B_bwd=rnd(b, l, g, n), C_bwd=rnd(b, l, g, n))
    for t in inp.values():
        t.requires_grad_(True)
    return inp


def _flip(t):
    return torch.flip(t, dims=(1,))


def case_fn(case, triton_backend):
    common = dict(chunk_size=CHUNK, dt_softplus=True)

    if case == "triton":
        return lambda i: bi_ssd(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"], dt_bias=i["dt_bias"],
                                backend=triton_backend, **common)
    if case == "torch":
        return lambda i: bi_ssd(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"], dt_bias=i["dt_bias"],
                                backend="torch", **common)
    if case == "triton_forward":
        return lambda i: bi_ssd(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"], dt_bias=i["dt_bias"],
                                direction="forward", backend=triton_backend, **common)
    if case == "naive_bi":
        def naive(i):
            one = lambda x, dt, B, C: bi_ssd(x, dt, i["A"], B, C, dt_bias=i["dt_bias"], direction="forward",  # noqa: E731
                                             backend=triton_backend, **common)
            y_f = one(i["x"], i["dt"], i["B"], i["C"])
            y_b = _flip(one(_flip(i["x"]), _flip(i["dt"]), _flip(i["B"]), _flip(i["C"])))
            return y_f + y_b + i["x"] * i["D"][:, None].to(i["x"].dtype)
        return naive
    if case == "hydra_fused":
        return lambda i: bi_ssd(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"], dt_bias=i["dt_bias"], shift=True,
                                dt_bwd=i["dt_bwd"], B_bwd=i["B_bwd"], C_bwd=i["C_bwd"], backend=triton_backend,
                                **common)
    if case == "hydra_composed":
        def composed(i):
            # the published Hydra: stack x with its time reversal on the batch, one causal scan,
            # roll one step forward, zero the first step, flip the second half back, add
            b = i["x"].shape[0]
            x2 = torch.cat((i["x"], _flip(i["x"])), dim=0)
            dt2 = torch.cat((i["dt"], _flip(i["dt_bwd"])), dim=0)
            B2 = torch.cat((i["B"], _flip(i["B_bwd"])), dim=0)
            C2 = torch.cat((i["C"], _flip(i["C_bwd"])), dim=0)
            y = bi_ssd(x2, dt2, i["A"], B2, C2, dt_bias=i["dt_bias"], direction="forward", backend=triton_backend,
                       **common)
            y = torch.roll(y, shifts=1, dims=1)
            y[:, 0] = 0.0
            return y[:b] + _flip(y[b:]) + i["x"] * i["D"][:, None].to(i["x"].dtype)
        return composed
    raise ValueError(case)


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------

def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def make_call(fn, inp, mode):
    leaves = list(inp.values())
    if mode == "fwd":
        return lambda: fn(inp)
    dy = torch.randn_like(fn(inp).detach())
    return lambda: torch.autograd.grad(fn(inp), leaves, dy)


def nbytes(t):
    return t.numel() * t.element_size()


def time_wall(call, device, budget_s):
    """Median per-call time of groups of back-to-back calls (ordinary launches), and of single calls."""
    _sync(device)
    t0 = time.perf_counter()
    call()
    _sync(device)
    one = max(time.perf_counter() - t0, 1e-6)
    k = int(min(10, max(1, 0.02 / one)))  # calls per group
    n_groups = int(min(25, max(5, budget_s / (2 * k * one))))
    groups = []
    for _ in range(n_groups):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(k):
            call()
        _sync(device)
        groups.append((time.perf_counter() - t0) / k)
    singles = []
    for _ in range(max(5, min(30, int(budget_s / (2 * one))))):
        _sync(device)
        t0 = time.perf_counter()
        call()
        _sync(device)
        singles.append(time.perf_counter() - t0)
    return statistics.median(groups) * 1e3, statistics.median(singles) * 1e3


def time_graph(call, budget_s):
    import triton.testing

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    rep_ms = max(50.0, min(400.0, budget_s * 1e3 / 2))
    ms = triton.testing.do_bench(g.replay, warmup=10, rep=rep_ms, return_mode="median")
    del g
    return ms


def peak_memory(call, device):
    if device != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak, base


def measure(shape_name, case, dtype, device, triton_backend, budget_s, do_graph):
    s = SHAPES[shape_name]
    inp = make_inputs(s, dtype, device, hydra=case in HYDRA_CASES)
    fn = case_fn(case, triton_backend)
    rows = []
    in_bytes = sum(nbytes(t) for t in inp.values())
    for mode in ("fwd", "fwd+bwd"):
        row = dict(shape=shape_name, case=case, mode=mode, dtype=str(dtype).replace("torch.", ""), **s)
        try:
            call = make_call(fn, inp, mode)
            for _ in range(3):  # compile / autotune / allocator warm-up
                call()
            _sync(device)
            y_bytes = nbytes(inp["x"])
            io = in_bytes + y_bytes + (y_bytes + in_bytes if mode == "fwd+bwd" else 0)
            mem = peak_memory(call, device)
            if mem is not None:
                peak, base = mem
                row.update(peak_mb=peak / 2**20, io_mb=io / 2**20, inputs_mb=in_bytes / 2**20,
                           mem_ratio=(in_bytes + peak) / io)
            row["wall_ms"], row["sync_ms"] = time_wall(call, device, budget_s)
            if do_graph and device == "cuda" and case != "torch":  # the PyTorch op copies host scalars: not capturable
                try:
                    row["graph_ms"] = time_graph(call, budget_s)
                except Exception as exc:  # noqa: BLE001 - recorded; graph capture is optional per case
                    row["graph_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                    torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
            row["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        rows.append(row)
        print(_row_line(row), flush=True)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    del inp
    return rows


def _row_line(r):
    f = lambda k, fmt="{:.3f}": fmt.format(r[k]) if k in r else "-"  # noqa: E731
    err = f"  ERROR {r['error']}" if "error" in r else (f"  graph: {r['graph_error']}" if "graph_error" in r else "")
    return (f"{r['shape']:16s} {r['case']:15s} {r['mode']:8s} wall {f('wall_ms')} ms  sync {f('sync_ms')} ms  "
            f"graph {f('graph_ms')} ms  peak {f('peak_mb', '{:.1f}')} MB  mem_ratio {f('mem_ratio', '{:.2f}')}{err}")


def check_equivalences(device, dtype, triton_backend, shape):
    """Before timing: the composed cases compute the same function as the fused ones.

    Runs at the first benchmarked shape with batch 2 (the batch is no kernel argument), so the
    kernels it compiles and tunes are the ones the benchmark uses anyway.
    """
    s = dict(shape, b=2)
    out = {}
    for case in CASES:
        inp = make_inputs(s, torch.float32, device, hydra=True, seed=1)
        fn = case_fn(case, triton_backend if case != "torch" else "torch")
        out[case] = fn(inp).detach().double()
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    checks = {
        "triton vs torch": rel(out["triton"], out["torch"]),
        "naive_bi vs triton": rel(out["naive_bi"], out["triton"]),
        "hydra_composed vs hydra_fused": rel(out["hydra_composed"], out["hydra_fused"]),
    }
    for k, v in checks.items():
        print(f"check {k}: rel {v:.2e}")
    return checks


# ---------------------------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------------------------

def _get(rows, shape, case, mode, key):
    for r in rows:
        if r["shape"] == shape and r["case"] == case and r["mode"] == mode and key in r:
            return r[key]
    return None


def targets(rows):
    t = []

    def add(name, value, target, le=True, unit=""):
        ok = None if value is None else (value <= target if le else value >= target)
        t.append(dict(target=name, measured=value, goal=("<= " if le else ">= ") + f"{target:g}{unit}", pass_=ok))

    d = "b16_L1600_h8"
    add("b16 L1600 h8 fwd+bwd, ordinary launches (ms)", _get(rows, d, "triton", "fwd+bwd", "wall_ms"), 1.0)
    add("b16 L1600 h8 fwd+bwd, GPU time / graph (ms)", _get(rows, d, "triton", "fwd+bwd", "graph_ms"), 0.5)
    lm = "lm_b8_L8192_h32"
    both, one = _get(rows, lm, "triton", "fwd+bwd", "wall_ms"), _get(rows, lm, "triton_forward", "fwd+bwd", "wall_ms")
    add("LM fwd+bwd bidirectional / one direction (ordinary launches)", both / one if both and one else None, 1.1)
    gb, go = _get(rows, lm, "triton", "fwd+bwd", "graph_ms"), _get(rows, lm, "triton_forward", "fwd+bwd", "graph_ms")
    add("LM fwd+bwd bidirectional / one direction (GPU time)", gb / go if gb and go else None, 1.1)
    add("LM fwd+bwd bidirectional, ordinary launches (ms)", both, 5.5)
    for sh in SHAPES:
        add(f"{sh} fwd+bwd peak memory / bytes of inputs+outputs+grads",
            _get(rows, sh, "triton", "fwd+bwd", "mem_ratio"), 1.1)
    for sh in DETECTION:
        f, c = _get(rows, sh, "hydra_fused", "fwd+bwd", "wall_ms"), _get(rows, sh, "hydra_composed", "fwd+bwd", "wall_ms")
        add(f"Hydra {sh} fwd+bwd speed-up fused vs composition (ordinary launches)", c / f if f and c else None, 2.0,
            le=False, unit="x")
        f, c = _get(rows, sh, "hydra_fused", "fwd+bwd", "graph_ms"), _get(rows, sh, "hydra_composed", "fwd+bwd", "graph_ms")
        add(f"Hydra {sh} fwd+bwd speed-up fused vs composition (GPU time)", c / f if f and c else None, 2.0,
            le=False, unit="x")
        f, c = _get(rows, sh, "hydra_fused", "fwd+bwd", "peak_mb"), _get(rows, sh, "hydra_composed", "fwd+bwd", "peak_mb")
        add(f"Hydra {sh} fwd+bwd peak memory fused / composition (above inputs)", f / c if f and c else None, 0.6)
        fi = _get(rows, sh, "hydra_fused", "fwd+bwd", "inputs_mb")
        add(f"Hydra {sh} fwd+bwd peak memory fused / composition (inputs included)",
            (f + fi) / (c + fi) if f and c and fi else None, 0.6)
    return t


def markdown(meta, rows, tgts):
    lines = [f"### Kernel benchmark: {meta['gpu']} ({meta['dtype']}, torch {meta['torch']}, triton {meta['triton']})", "",
             f"Command: `{meta['command']}`", "",
             "ms = median; wall = ordinary launches (back-to-back calls, host work included); graph = CUDA-graph "
             "replay (GPU time); peak = max allocated during fwd+bwd above the inputs.", "",
             "| shape | case | fwd wall | fwd graph | fwd+bwd wall | fwd+bwd graph | fwd+bwd peak MB | mem / io |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    f = lambda v, fmt="{:.3f}": "-" if v is None else fmt.format(v)  # noqa: E731
    for sh in SHAPES:
        for case in CASES:
            if not any(r["shape"] == sh and r["case"] == case for r in rows):
                continue
            g = lambda mode, key: _get(rows, sh, case, mode, key)  # noqa: E731
            err = next((r.get("error") for r in rows if r["shape"] == sh and r["case"] == case and "error" in r), None)
            if err:
                lines.append(f"| {sh} | {case} | error: {err[:80]} | | | | | |")
                continue
            lines.append(f"| {sh} | {case} | {f(g('fwd', 'wall_ms'))} | {f(g('fwd', 'graph_ms'))} | "
                         f"{f(g('fwd+bwd', 'wall_ms'))} | {f(g('fwd+bwd', 'graph_ms'))} | "
                         f"{f(g('fwd+bwd', 'peak_mb'), '{:.1f}')} | {f(g('fwd+bwd', 'mem_ratio'), '{:.2f}')} |")
    lines += ["", "| target | goal | measured | met |", "|---|---|---:|---|"]
    for t in tgts:
        met = {True: "yes", False: "NO", None: "n/a"}[t["pass_"]]
        lines.append(f"| {t['target']} | {t['goal']} | {f(t['measured'])} | {met} |")
    return "\n".join(lines) + "\n"


def chart(rows, path, meta):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = [sh for sh in SHAPES if any(r["shape"] == sh for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.5))
    width = 0.8 / len(CASES)
    for ax, key, title in ((axes[0], "wall_ms", "fwd+bwd, ordinary launches"), (axes[1], "graph_ms", "fwd+bwd, GPU time (graph)")):
        for ci, case in enumerate(CASES):
            vals = [_get(rows, sh, case, "fwd+bwd", key) or 0.0 for sh in shapes]
            xs = [i + (ci - len(CASES) / 2 + 0.5) * width for i in range(len(shapes))]
            ax.bar(xs, vals, width, label=case)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes, rotation=15, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms (median, log scale)")
        ax.set_title(title)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"bi_ssd {meta['dtype']} on {meta['gpu']} (torch {meta['torch']}, triton {meta['triton']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gpu_slug(name):
    s = name.lower().replace("nvidia", "").strip()
    s = "".join(ch if ch.isalnum() else "-" for ch in s).strip("-")
    while "--" in s:
        s = s.replace("--", "-")
    return s or "gpu"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--triton-backend", default="triton", help="'torch' only to dry-run this script without Triton")
    ap.add_argument("--budget", type=float, default=0.6, help="seconds of timing per case and mode")
    ap.add_argument("--quick", action="store_true", help="shorter timing budget")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--no-check", action="store_true", help="skip the fp32 equivalence check of the cases")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--tag", default=None, help="file name suffix (default: the GPU's name)")
    ap.add_argument("--shape-override", default=None, help="JSON dict of shape -> sizes (dry runs)")
    ap.add_argument("--force-configs", default=None, metavar="FWD,BWD,STATE",
                    help="run the Triton kernels with these config indices instead of autotuning them (saves the "
                         "autotuner's compiles of every config; recorded in the JSON)")
    a = ap.parse_args(argv)
    forced = contextlib.nullcontext()
    if a.force_configs and a.triton_backend == "triton":
        from yolo_bimamba.ops.bi_ssd import tuning

        fi, bi, si = (int(v) for v in a.force_configs.split(","))
        forced = tuning.force_config(fwd=fi, bwd=bi, state=si)
    with forced:
        _main(a, argv)


def _main(a, argv):

    if a.shape_override:
        SHAPES.clear()
        SHAPES.update(json.loads(a.shape_override))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    budget = 0.25 if a.quick else a.budget
    import triton

    gpu = torch.cuda.get_device_name() if a.device == "cuda" else platform.processor() or "cpu"
    tag = a.tag or gpu_slug(gpu)
    meta = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                dtype=a.dtype, chunk_size=CHUNK, device=a.device, triton_backend=a.triton_backend,
                command="python " + " ".join([os.path.relpath(__file__, ROOT)] + (argv if argv is not None else sys.argv[1:])),
                date=time.strftime("%Y-%m-%d %H:%M:%S"), host_python=platform.python_version(),
                forced_configs=a.force_configs)
    if a.triton_backend == "triton":
        from yolo_bimamba import config
        from yolo_bimamba.ops.bi_ssd import tuning as tk

        meta["configs"] = {name: [dict(c.kwargs, num_warps=c.num_warps) for c in cfgs] for name, cfgs in
                           (("fwd", tk.FWD_CONFIGS), ("bwd", tk.BWD_CONFIGS), ("state", tk.STATE_CONFIGS),
                            ("pairs", tk.PAIRS_CONFIGS))}
        meta["programs_per_sm"] = config.PROGRAMS_PER_SM
        meta["split_directions"] = config.SPLIT_DIRECTIONS  # "auto", "1" or "0"
    print(json.dumps(meta), flush=True)
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (out_dir / f"kernels-{tag}.{ext}" for ext in ("json", "md", "png"))

    if not a.no_check:
        first = next(sh for sh in a.shapes.split(",") if sh in SHAPES)
        meta["equivalence_checks"] = check_equivalences(a.device, dtype, a.triton_backend, SHAPES[first])
    rows = []
    cases = a.cases.split(",")
    for sh in a.shapes.split(","):
        if sh not in SHAPES:
            continue
        for case in cases:
            if case in HYDRA_CASES and sh not in DETECTION and not a.shape_override:
                continue  # the Hydra comparison is at detection shapes
            rows += measure(sh, case, dtype, a.device, a.triton_backend, budget, not a.no_graph)
            tg = targets(rows)
            json_path.write_text(json.dumps(dict(meta=meta, rows=rows, targets=tg), indent=1))  # partial results survive a timeout
    tg = targets(rows)
    json_path.write_text(json.dumps(dict(meta=meta, rows=rows, targets=tg), indent=1))
    md = markdown(meta, rows, tg)
    md_path.write_text(md)
    try:
        chart(rows, png_path, meta)
    except Exception as exc:  # noqa: BLE001 - the chart is a convenience
        print(f"chart failed: {exc}")
    print()
    print(md)
    print(f"wrote {json_path}, {md_path}, {png_path}")


if __name__ == "__main__":
    main()
