#!/bin/bash
# Session 31, second GPU call: the kernel benchmark (autotuned, bf16, all shapes; the Triton op both directions and
# one, Hydra mode fused and composed) on the tree as it is, after session30/call1.sh ran the GPU suite on it.
# From the repository root, with LIMIT=<timeout_s>, carry .whl.
set -u
LIMIT=${LIMIT:-590}
. benchmarks/results/session26/lib.sh  # start_call, bench_all
start_call
bench_all -s31
cat $W/gpu.txt
tar -C $W -cf $FINAL/call2.tar . && echo packed t=$SECONDS
