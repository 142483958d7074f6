#!/bin/bash
# Session 31, second GPU call: the kernel benchmark (autotuned, bf16, all shapes; the Triton op both directions and
# one, Hydra mode fused and composed) on the tree as it is, after session30/call1.sh ran the GPU suite on it.
# From the repository root, with LIMIT=<timeout_s>, carry .whl.
set -u
LIMIT=${LIMIT:-590}
. benchmarks/results/session26/lib.sh  # start_call
start_call
echo "== bench t=$SECONDS"
OUT=$W RUN_TESTS=0 BENCH_TIMEOUT=$(( LIMIT - 30 - SECONDS )) TAG_SUFFIX=-s31 \
  BENCH_ARGS="--cases triton,triton_forward,hydra_fused,hydra_composed --budget 0.2 --no-check" \
  bash benchmarks/run_gpu.sh > /dev/null 2>&1
echo rc=$?; sed -n '/^| shape/,/^$/p' $W/kernels-*-s31.md; grep -E "NO|yes" $W/kernels-*-s31.md | head -12
cat $W/gpu.txt
tar -C $W -cf $FINAL/call2.tar . && echo packed t=$SECONDS
