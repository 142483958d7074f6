#!/bin/bash
# Session 32, second GPU call: the GPU suite and the kernel benchmark (autotuned, bf16, all shapes; the Triton op both
# directions and one, Hydra mode fused and composed) on the session's final kernels (b48f923: session 31's pairs rule).
# From the repository root, with LIMIT=<timeout_s>, carry .whl.
set -u
LIMIT=${LIMIT:-590}
. benchmarks/results/session26/lib.sh  # start_call, bench_all
start_call
echo "== tests t=$SECONDS"
OUT=$W RUN_BENCH=0 TEST_TIMEOUT=240 XDIST_N=12 TAG_SUFFIX=-s32 bash benchmarks/run_gpu.sh > /dev/null 2>&1
echo rc=$?; tail -2 $W/gpu-tests-*-s32.log
bench_all -s32
cat $W/gpu.txt
tar -C $W -cf $FINAL/call2.tar . && echo packed t=$SECONDS
