#!/bin/bash
# Session 28, fourth GPU call (H200): the in-chunk pairs kernels in chunks of 64 rows (the default config picks 4 warps
# there at headdim or d_state 64; the third call found 2 warps faster for the forward's): the backward pairs kernel
# in chunks of 64 (backward config 2, BLOCK_Q 64) with 2 / 4 warps at b16 L1600 h8 p64 n64 and b32 L1600 h8 p32 n32,
# two rounds; the pairs configs at default backward configs once more. From the repository root.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof
start_call
S=b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32 prof q64-r1 $PWD --directions both,forward --bwd-cfgs 2 --pairs-cfgs 0,1
S=b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32 prof q64-r2 $PWD --directions both,forward --bwd-cfgs 2 --pairs-cfgs 1,0
prof pc-r3 $PWD --directions both,forward --pairs-cfgs 1,0
python benchmarks/results/session28/knobs_summary.py $W  # (this code ran inline in the call; moved there afterwards)
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
