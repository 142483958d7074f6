#!/bin/bash
# Session 32, third GPU call: the GPU suite again (the second call's first, on a cold machine, stopped at its 240 s
# limit with 228 of 231 passed and three autotuning tests still compiling). From the repository root, carry .whl.
set -u
. benchmarks/results/session26/lib.sh  # start_call
start_call
OUT=$W RUN_BENCH=0 TEST_TIMEOUT=420 XDIST_N=12 TAG_SUFFIX=-s32 bash benchmarks/run_gpu.sh > /dev/null 2>&1
echo rc=$?; tail -2 $W/gpu-tests-*-s32.log
tar -C $W -cf $FINAL/call3.tar . && echo packed t=$SECONDS
