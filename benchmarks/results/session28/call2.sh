#!/bin/bash
# Session 28, second GPU call (H200): the tree with session27/processed-dt.patch applied (37f86c8 + the patch, which
# lands as the next commit; update-weight.patch left out after the first call): the whole GPU suite, then the kernel
# benchmark (autotuned, bf16, all shapes, the Triton op both directions and one, Hydra fused and composed).
# From the repository root, carry .whl.
set -u
. benchmarks/results/session26/lib.sh  # start_call
start_call
echo "== suite t=$SECONDS"
OUT=$W YOLO_BIMAMBA_AUTOTUNE=0 TEST_TIMEOUT=300 XDIST_N=12 RUN_BENCH=0 TAG_SUFFIX=-s28 \
  bash benchmarks/run_gpu.sh > $W/suite-console.log 2>&1; echo rc=$?; tail -3 $W/suite-console.log
echo "== bench t=$SECONDS"
OUT=$W RUN_TESTS=0 BENCH_TIMEOUT=$(( 570 - SECONDS )) TAG_SUFFIX=-s28 \
  BENCH_ARGS="--cases triton,triton_forward,hydra_fused,hydra_composed --budget 0.2 --no-check" \
  bash benchmarks/run_gpu.sh > /dev/null 2>&1
echo rc=$?; sed -n '/^| shape/,/^$/p' $W/kernels-h200-s28.md; grep -E "NO|yes" $W/kernels-h200-s28.md | head -8
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
