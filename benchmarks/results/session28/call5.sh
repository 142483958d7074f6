#!/bin/bash
# Session 28, fifth GPU call (H200): the whole GPU suite (default configs, no autotuning) on the tree with the pairs
# kernels' new default configs (the forward's 2 warps in chunks of 64, the backward's 4 warps in chunks of 64 at every
# size), in the device time that was left. From the repository root, carry .whl.
set -u
. benchmarks/results/session26/lib.sh  # start_call
start_call
OUT=$W YOLO_BIMAMBA_AUTOTUNE=0 TEST_TIMEOUT=260 XDIST_N=14 RUN_BENCH=0 TAG_SUFFIX=-s28-pairs-defaults \
  bash benchmarks/run_gpu.sh > $W/suite-console.log 2>&1; echo rc=$?; tail -3 $W/suite-console.log
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
