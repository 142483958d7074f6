#!/bin/bash
# Session 27, fourth GPU call (H200): Nsight Compute source counters (stall samples and instructions per source line)
# of the backward segment kernel, the backward pairs kernel and the forward kernel at the LM shape (b8 L8192 h32 p64
# n128, bf16, both directions, default configs) on the tree, for the next sessions' work. From the repository root.
set -u
. benchmarks/results/session26/lib.sh  # start_call
start_call
NCU="ncu --clock-control none --launch-skip 2 --launch-count 1 --import-source yes --section SourceCounters
  --section WarpStateStats --section LaunchStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis"
for k in bwd bwd_pairs fwd; do
  [ $SECONDS -gt 420 ] && { echo skip ncu $k t=$SECONDS; continue; }
  YOLO_BIMAMBA_AUTOTUNE=0 timeout 120 $NCU -k regex:"_bi_ssd_${k}_kernel" -o $W/ncu-lm-$k \
    python benchmarks/results/session27/ncu_one.py lm > $W/ncu-lm-$k.log 2>&1; echo ncu $k rc=$? t=$SECONDS
  ncu -i $W/ncu-lm-$k.ncu-rep --page source --csv --print-source cuda,sass 2>&1 | gzip > $W/ncu-src-lm-$k.csv.gz
  ncu -i $W/ncu-lm-$k.ncu-rep --page details --csv > $W/ncu-details-lm-$k.csv 2>&1
done
cd $W && rm -f *.ncu-rep && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
