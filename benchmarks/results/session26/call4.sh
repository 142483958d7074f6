#!/bin/bash
# Session 26, fourth GPU call (H200): the committed kernels (the backward pairs kernel's and the forward kernel's loads
# ahead, by their rules) against df92816 (ab/base), one round of per-kernel CUDA time at default configs; the whole GPU
# suite (benchmarks/run_gpu.sh, Ultralytics from .whl/); the kernel benchmark (autotuned). From the repository root,
# carry ab and .whl.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
prof last-base $PWD/ab/base --directions both,forward
prof last-new $PWD --directions both,forward
summary last-base last-new
echo "== suite t=$SECONDS"
OUT=$W YOLO_BIMAMBA_AUTOTUNE=0 TEST_TIMEOUT=${TEST_TIMEOUT:-300} XDIST_N=12 RUN_BENCH=0 TAG_SUFFIX=-s26-final \
  bash benchmarks/run_gpu.sh > $W/suite-console.log 2>&1; echo rc=$?; tail -4 $W/suite-console.log
echo "== bench t=$SECONDS"
OUT=$W RUN_TESTS=0 BENCH_TIMEOUT=${BENCH_TIMEOUT:-170} TAG_SUFFIX=-s26-final \
  BENCH_ARGS="--cases triton,triton_forward --budget 0.25 --no-check" bash benchmarks/run_gpu.sh > /dev/null 2>&1
echo rc=$?; sed -n '/^| shape/,/^$/p' $W/kernels-h200-s26-final.md; grep "NO\|yes" $W/kernels-h200-s26-final.md | head -6
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
