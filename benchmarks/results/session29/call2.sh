#!/bin/bash
# Session 29, second GPU call: the same A/B as call1.sh (which ran on an H100) on an H200 if one comes: per-kernel
# CUDA time (default configs) of ab/base, the working tree with all three patches, ab/p1 and ab/p3, then the tree and
# base again. Everything is packed into one tar (a reply brings back only a few files). From the repository root,
# with LIMIT=<timeout_s>, carry ab and .whl.
set -u
LIMIT=${LIMIT:-300}
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
for n in base-r1:ab/base all-r1:ab/all p1-r1:ab/p1 p3-r1:ab/p3 all-r2:ab/all base-r2:ab/base; do
  [ $SECONDS -lt $(( LIMIT - 60 )) ] && PROF_TIMEOUT=$(( LIMIT - 25 - SECONDS )) prof ${n%%:*} $PWD/${n#*:} --directions both,forward
done
summary base-r1 all-r1 p1-r1 p3-r1 all-r2 base-r2 | tee $W/summary.txt
cat $W/gpu.txt
tar -C $W -cf $OUT/call2.tar . && echo done t=$SECONDS
