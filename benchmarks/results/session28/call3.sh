#!/bin/bash
# Session 28, third GPU call (H200): with the processed dt (the tree of the second call), the host-chosen knobs again,
# since the pairs kernels lost the softplus and its registers: the backward pairs kernel's AHEAD (2, 3) and configs
# (2 / 4 / 8 warps), the backward segment kernel's AHEAD (0, 2, 3, 7); per-kernel CUDA time, default configs
# otherwise, both directions and one, two rounds. From the repository root.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof
start_call
prof pa-r1 $PWD --directions both,forward --pairs-ahead 2,3
prof pc-r1 $PWD --directions both,forward --pairs-cfgs 0,1,2
prof ba-r1 $PWD --directions both,forward --bwd-ahead 0,2,3,7
[ $SECONDS -lt 330 ] && prof pa-r2 $PWD --directions both,forward --pairs-ahead 3,2
[ $SECONDS -lt 380 ] && prof pc-r2 $PWD --directions both,forward --pairs-cfgs 2,1,0
[ $SECONDS -lt 400 ] && PROF_TIMEOUT=120 prof ba-r2 $PWD --directions both,forward --bwd-ahead 7,3,2,0
python benchmarks/results/session28/knobs_summary.py $W  # (this code ran inline in the call; moved there afterwards)
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
