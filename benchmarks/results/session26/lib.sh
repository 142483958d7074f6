#!/bin/bash
# Session 26's A/B helpers (sourced by the call scripts): prof NAME TREE ARGS... profiles one tree's kernels
# (benchmarks/profile_gpu.py kernels, default configs) at the shapes $S into $W/NAME.json; summary NAME... prints each
# run's total and per-kernel CUDA time.
# SUMMARY_ALL=1 summary NAME...: every kernel of each run, with its pairs AHEAD and programs per SM (session 31's
# fourth call ran these lines inline; moved here afterwards, the same output)
prof() { n=$1; t=$2; shift 2; echo "== $n t=$SECONDS"; YOLO_BIMAMBA_AUTOTUNE=0 PYTHONPATH=$t timeout ${PROF_TIMEOUT:-150} \
  python $t/benchmarks/profile_gpu.py kernels --pps 2 --shapes $S "$@" --out $W/$n.json > $W/$n.log 2>&1; echo rc=$?; }
summary() { python - $W "$@" <<'PY'
import json, os, sys
w = sys.argv[1]
for n in sys.argv[2:]:
    try:
        runs = json.load(open(f"{w}/{n}.json"))["runs"]
    except Exception as e:
        print(n, "missing", e); continue
    for r in runs:
        k = r["kernels_ms"]
        if os.environ.get("SUMMARY_ALL"):
            print(f'{n:7s} {r["shape"][:22]:22s} {r["direction"]:8s} pa={r.get("pairs_ahead")} pps={r.get("pps", r.get("programs_per_sm"))} '
                  f'total {r["total_ms"]:.3f} ' + " ".join(f"{a.replace('_bi_ssd_', '').replace('_kernel', '')} {v:.3f}" for a, v in sorted(k.items())))
            continue
        print(f'{n:8s} {r["shape"][:22]:22s} {r["direction"]:8s} ahead={r.get("pairs_ahead")} fa={r.get("fwd_ahead")} pcfg={r.get("pairs_cfg")} '
              f'total {r["total_ms"]:.3f} bwd {k.get("_bi_ssd_bwd_kernel", 0):.3f} '
              f'bwd_pairs {k.get("_bi_ssd_bwd_pairs_kernel", 0):.3f} fwd {k.get("_bi_ssd_fwd_kernel", 0):.3f} '
              f'fwd_pairs {k.get("_bi_ssd_fwd_pairs_kernel", 0):.3f}')
PY
}
# start_call: what each call does first (outputs into $W, packed into $OUT at the end): the GPU, driver and versions.
# Calls 1-3 had these lines inline when they ran; they were moved here afterwards (the same commands)
start_call() {
  FINAL=$OUT; W=/tmp/w; mkdir -p $W
  export PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
  python -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" >> $W/gpu.txt
  S=b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32,lm_b8_L8192_h32_p64_n128
}
# env_rounds VAR NAME:VALUE...: one prof run per NAME (both directions) with VAR=VALUE, in the order given while the
# call's LIMIT leaves time, then their summary into $W/summary.txt (session 31's third and session 32's first call had
# these lines inline when they ran; moved here afterwards, the same commands)
env_rounds() { var=$1; shift
  for n in "$@"; do
    [ $SECONDS -lt $(( LIMIT - 40 )) ] || continue
    ( export "$var=${n#*:}"; PROF_TIMEOUT=$(( LIMIT - 20 - SECONDS )) prof ${n%%:*} $PWD --directions both )
  done
  summary "${@%%:*}" | tee $W/summary.txt
}
# bench_all SUFFIX: the kernel benchmark (autotuned, bf16, all shapes; the Triton op both directions and one, Hydra
# mode fused and composed) into $W with TAG_SUFFIX SUFFIX, then its table and targets (session 31's and 32's second
# calls had these lines inline when they ran; moved here afterwards, the same commands)
bench_all() {
  echo "== bench t=$SECONDS"
  OUT=$W RUN_TESTS=0 BENCH_TIMEOUT=$(( LIMIT - 30 - SECONDS )) TAG_SUFFIX=$1 \
    BENCH_ARGS="--cases triton,triton_forward,hydra_fused,hydra_composed --budget 0.2 --no-check" \
    bash benchmarks/run_gpu.sh > /dev/null 2>&1
  echo rc=$?; sed -n '/^| shape/,/^$/p' $W/kernels-*$1.md; grep -E "NO|yes" $W/kernels-*$1.md | head -12
}
