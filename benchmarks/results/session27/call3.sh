#!/bin/bash
# Session 27, third GPU call (H200): the kernel benchmark (benchmarks/bench_kernels.py, autotuned, bf16) on the tree
# with the backward segment kernel's AHEAD rule: the Triton op both directions and one, and Hydra mode fused against
# the flip/cat/roll composition; then Hydra fused on 65bb69f (ab/base) at b16 L1600 h8 for an A/B of that mode
# (its segment kernel takes the new bits too). From the repository root, carry ab.
set -u
. benchmarks/results/session26/lib.sh  # start_call
start_call
echo "== bench t=$SECONDS"
OUT=$W RUN_TESTS=0 BENCH_TIMEOUT=380 TAG_SUFFIX=-s27 \
  BENCH_ARGS="--cases triton,triton_forward,hydra_fused,hydra_composed --budget 0.2 --no-check" \
  bash benchmarks/run_gpu.sh > /dev/null 2>&1
echo rc=$?; sed -n '/^| shape/,/^$/p' $W/kernels-h200-s27.md
echo "== hydra base t=$SECONDS"
[ $SECONDS -lt 460 ] && (cd ab/base && timeout $(( 560 - SECONDS )) python benchmarks/bench_kernels.py --out-dir $W \
  --tag h200-s27-hydra-base --shapes b16_L1600_h8 --cases hydra_fused --budget 0.2 --no-check > $W/bench-hydra-base.log 2>&1; \
  echo rc=$?; sed -n '/^| shape/,/^$/p' $W/kernels-h200-s27-hydra-base.md)
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
