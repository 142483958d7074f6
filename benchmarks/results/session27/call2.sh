#!/bin/bash
# Session 27, second GPU call (H200): the backward segment kernel's AHEAD bits by their rule (triton_op.bwd_ahead_bits)
# in the tree against 65bb69f (ab/base = git archive 65bb69f yolo_bimamba benchmarks/*.py), per-kernel CUDA time at
# default configs, two rounds in alternating order; the pairs kernels' register cap at p32 n32 again (ab/px, PAIRS_CONFIGS
# 0 and 4 = 2 warps uncapped / capped at 168 registers); the whole GPU suite (benchmarks/run_gpu.sh, Ultralytics from
# .whl/). From the repository root, carry ab and .whl.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
prof base-r2 $PWD/ab/base --directions both,forward
prof new-r2 $PWD --directions both,forward
prof new-r3 $PWD --directions both,forward
prof base-r3 $PWD/ab/base --directions both,forward
PAIRS_TRIAL=1 S=b32_L1600_h8_p32_n32 prof pcap2 $PWD/ab/px --directions both,forward --pairs-cfgs 0,4,0,4
summary base-r2 new-r2 new-r3 base-r3 pcap2
echo "== suite t=$SECONDS"
OUT=$W YOLO_BIMAMBA_AUTOTUNE=0 TEST_TIMEOUT=$(( 575 - SECONDS )) XDIST_N=12 RUN_BENCH=0 TAG_SUFFIX=-s27 \
  bash benchmarks/run_gpu.sh > $W/suite-console.log 2>&1; echo rc=$?; tail -4 $W/suite-console.log
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
