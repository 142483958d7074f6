#!/bin/bash
# Session 27, sixth GPU call (H200): the kernel benchmark (autotuned, bf16) at b16 L1600 h8 and the LM shape on the
# committed tree (b3e95b7), both directions and one, in the device time that was left. From the repository root.
set -u
. benchmarks/results/session26/lib.sh  # start_call
start_call
timeout 150 python benchmarks/bench_kernels.py --out-dir $W --tag h200-s27-final --shapes b16_L1600_h8,lm_b8_L8192_h32 \
  --cases triton,triton_forward --budget 0.2 --no-check 2>&1 | tee $W/bench-h200-s27-final.log | grep -v "^ *$" | tail -25
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
