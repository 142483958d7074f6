#!/bin/bash
# Session 27, fifth GPU call (H200): the backward pairs kernel's group sums of the segment kernel's per-head rows added
# in their load layout (_parts_sum) in the tree against 0c736e2 (ab/base = git archive 0c736e2 yolo_bimamba
# benchmarks/*.py), per-kernel CUDA time at default configs, two rounds in alternating order; then the whole GPU suite
# (benchmarks/run_gpu.sh, Ultralytics from .whl/). From the repository root, carry ab and .whl.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
prof sum-base-r1 $PWD/ab/base --directions both,forward
prof sum-new-r1 $PWD --directions both,forward
prof sum-new-r2 $PWD --directions both,forward
prof sum-base-r2 $PWD/ab/base --directions both,forward
summary sum-base-r1 sum-new-r1 sum-new-r2 sum-base-r2
echo "== suite t=$SECONDS"
OUT=$W YOLO_BIMAMBA_AUTOTUNE=0 TEST_TIMEOUT=$(( 430 - SECONDS )) XDIST_N=12 RUN_BENCH=0 TAG_SUFFIX=-s27-sums \
  bash benchmarks/run_gpu.sh > $W/suite-console.log 2>&1; echo rc=$?; tail -4 $W/suite-console.log
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
