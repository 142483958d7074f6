#!/bin/bash
# Session 25's A/B helpers, sourced by call1.sh and call2.sh (moved here from them after the runs; same commands):
# prof NAME TREE ARGS... profiles one tree's kernels (benchmarks/profile_gpu.py kernels) into $W/NAME.json;
# summary NAME... prints each run's total and the forward / backward kernels' CUDA time.
prof() { n=$1; t=$2; shift 2; echo "== $n t=$SECONDS"; PYTHONPATH=$t timeout 200 python $t/benchmarks/profile_gpu.py kernels \
  --pps 2 --shapes $S "$@" --out $W/$n.json > $W/$n.log 2>&1; echo rc=$?; }
summary() { python - $W "$@" <<'PY'
import json, sys
w = sys.argv[1]
for n in sys.argv[2:]:
    try:
        runs = json.load(open(f"{w}/{n}.json"))["runs"]
    except Exception as e:
        print(n, "missing", e); continue
    for r in runs:
        k = r["kernels_ms"]
        print(f'{n:8s} {r["shape"][:22]:22s} {r["direction"]:8s} heads={r.get("fwd_heads")} total {r["total_ms"]:.3f} '
              f'fwd {k.get("_bi_ssd_fwd_kernel", 0):.3f} fwd_pairs {k.get("_bi_ssd_fwd_pairs_kernel", 0):.3f} '
              f'bwd {k.get("_bi_ssd_bwd_kernel", 0):.3f} bwd_pairs {k.get("_bi_ssd_bwd_pairs_kernel", 0):.3f}')
PY
}
