#!/bin/bash
# Session 31, fourth GPU call: two host-chosen knobs on the current kernels, per-kernel CUDA time at default configs,
# two rounds (the second in reverse order): the backward pairs kernel's AHEAD (2, 3) at b32 L1600 h8 p32 n32, where
# the rule picks 3 and session 28 saw 2 faster; the segment kernels' programs per SM (1, 2, 3; the rule: 2) at the
# two detection shapes. From the repository root, with LIMIT=<timeout_s>.
set -u
LIMIT=${LIMIT:-590}
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
S=b32_L1600_h8_p32_n32
PROF_TIMEOUT=120 prof pa-r1 $PWD --directions both,forward --pairs-ahead 2,3
S=b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32
PROF_TIMEOUT=120 prof pps-r1 $PWD --directions both --pps 1,2,3
PROF_TIMEOUT=120 prof pps-r2 $PWD --directions both --pps 3,2,1
S=b32_L1600_h8_p32_n32
PROF_TIMEOUT=$(( LIMIT - 20 - SECONDS )) prof pa-r2 $PWD --directions both,forward --pairs-ahead 3,2
SUMMARY_ALL=1 summary pa-r1 pa-r2 pps-r1 pps-r2 | tee $W/summary.txt
tar -C $W -cf $FINAL/call4.tar . && echo packed t=$SECONDS
