"""Session 28: one line per profiled run of the call's knob sweeps (benchmarks/profile_gpu.py kernels JSONs in the
folder given, rounds 1-3): the forced knobs, the fwd+bwd total and the kernels the sweeps move, ms. Calls 3 and 4 ran
this code inline when they ran; it was moved here afterwards (the same code, with both calls' columns).

    python benchmarks/results/session28/knobs_summary.py FOLDER
"""
import glob
import json
import os
import sys

for f in sorted(glob.glob(sys.argv[1] + "/*-r[123].json")):
    for r in json.load(open(f))["runs"]:
        k = r["kernels_ms"]
        knobs = " ".join(f"{n}={r.get(key)}" for n, key in (("pa", "pairs_ahead"), ("pc", "pairs_cfg"),
                                                               ("ba", "bwd_ahead"), ("bc", "bwd_cfg")))
        ms = " ".join(f"{n} {k.get('_bi_ssd_' + key, 0):.3f}" for n, key in (
            ("bwd", "bwd_kernel"), ("bp", "bwd_pairs_kernel"), ("fwd", "fwd_kernel"), ("fp", "fwd_pairs_kernel")))
        print(f'{os.path.basename(f)[:-5]:6s} {r["shape"][:13]:13s} {r["direction"][:4]} {knobs} '
              f'tot {r["total_ms"]:.3f} {ms}')
