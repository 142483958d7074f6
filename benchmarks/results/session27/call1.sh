#!/bin/bash
# Session 27, first GPU call (H200). From the repository root, carry ab.
# 1. A/B of the backward segment kernel's partial loads ahead above 32 x 32 tiles (trial.patch = session 26's
#    bwd-partial-ahead.patch, env XVAR: 1 B and C, 2 dz, 4 x one chunk ahead) against the tree, per-kernel CUDA time,
#    default configs, b16 L1600 h8 p64 n64 and the LM shape, both directions and one;
# 2. register caps for the in-chunk pairs kernels (trial.patch with PAIRS_TRIAL=1: PAIRS_CONFIGS 3-6 = 2 warps at
#    200 / 168 / 128 registers, 4 warps at 128);
# 3. Nsight Compute source counters (stall samples per source line) of the backward segment and pairs kernels at
#    b16 L1600 h8 p64 n64 on the tree.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
S=b16_L1600_h8_p64_n64,lm_b8_L8192_h32_p64_n128
PX=$PWD/ab/px  # = git archive HEAD yolo_bimamba benchmarks/*.py, then patch -p1 < trial.patch (carried)
prof base-r1 $PWD --directions both,forward
for v in 2 3 6 7 4; do [ $SECONDS -gt 400 ] && break; XVAR=$v prof x$v-r1 $PX --directions both,forward; done
PAIRS_TRIAL=1 S=b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32 prof pcap $PX --directions both --pairs-cfgs 0,3,4,5,6
summary base-r1 x2-r1 x3-r1 x6-r1 x7-r1 x4-r1 pcap
NCU="ncu --clock-control none --launch-skip 2 --launch-count 1 --import-source yes --section SourceCounters
  --section WarpStateStats --section LaunchStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis"
for k in bwd bwd_pairs; do
  [ $SECONDS -gt 470 ] && { echo skip ncu $k t=$SECONDS; continue; }
  YOLO_BIMAMBA_AUTOTUNE=0 timeout 60 $NCU -k regex:"_bi_ssd_${k}_kernel" -o $W/ncu-$k \
    python benchmarks/results/session27/ncu_one.py b16 > $W/ncu-$k.log 2>&1; echo ncu $k rc=$? t=$SECONDS
  ncu -i $W/ncu-$k.ncu-rep --page source --csv --print-source cuda,sass 2>&1 | gzip > $W/ncu-src-$k.csv.gz
  ncu -i $W/ncu-$k.ncu-rep --page details --csv > $W/ncu-details-$k.csv 2>&1
done
cd $W && rm -f *.ncu-rep && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
