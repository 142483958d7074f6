#!/bin/bash
# Session 26, second GPU call (H200): the tree with the backward pairs kernel's AHEAD rule (3 up to 32 x 32 tiles, 2
# above) against df92816 (ab/base), one round of per-kernel CUDA time at default configs; the whole GPU suite
# (benchmarks/run_gpu.sh, Ultralytics from .whl/); the kernel benchmark (autotuned). From the repository root, carry
# ab and .whl.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
prof final-base $PWD/ab/base --directions both,forward
prof final-new $PWD --directions both,forward
summary final-base final-new
echo "== suite t=$SECONDS"
OUT=$W YOLO_BIMAMBA_AUTOTUNE=0 TEST_TIMEOUT=${TEST_TIMEOUT:-300} XDIST_N=12 RUN_BENCH=0 TAG_SUFFIX=-s26 \
  bash benchmarks/run_gpu.sh > $W/suite-console.log 2>&1; echo rc=$?; tail -4 $W/suite-console.log
echo "== bench t=$SECONDS"
OUT=$W RUN_TESTS=0 BENCH_TIMEOUT=${BENCH_TIMEOUT:-170} TAG_SUFFIX=-s26 \
  BENCH_ARGS="--cases triton,triton_forward --budget 0.25 --no-check" bash benchmarks/run_gpu.sh > /dev/null 2>&1
echo rc=$?; tail -22 $W/bench-h200-s26.log
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
