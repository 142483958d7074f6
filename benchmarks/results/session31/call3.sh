#!/bin/bash
# Session 31, third GPU call: the backward's ordered group rows (YOLO_BIMAMBA_ORDERED_ROWS=1, the memory mode) against
# the default per-head rows on the current kernels: per-kernel CUDA time at default configs, both directions, three
# shapes, two rounds in mirrored order (0, 1, 1, 0). From the repository root, with LIMIT=<timeout_s>.
set -u
LIMIT=${LIMIT:-590}
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
for n in ord0-r1:0 ord1-r1:1 ord1-r2:1 ord0-r2:0; do
  [ $SECONDS -lt $(( LIMIT - 40 )) ] || continue
  YOLO_BIMAMBA_ORDERED_ROWS=${n#*:} PROF_TIMEOUT=$(( LIMIT - 20 - SECONDS )) prof ${n%%:*} $PWD --directions both
done
summary ord0-r1 ord1-r1 ord1-r2 ord0-r2 | tee $W/summary.txt
tar -C $W -cf $FINAL/call3.tar . && echo packed t=$SECONDS
