#!/bin/bash
# Session 29, first GPU call (H200): session 28's three CPU-prepared candidates. The working tree = 114d787 +
# bwd-ahead-one-direction.patch + pairs-ahead-2.patch + processed-as-is.patch: the whole GPU suite (default configs),
# then per-kernel CUDA time (default configs, three shapes, both directions and one) of ab/base (git archive 114d787
# yolo_bimamba benchmarks/*.py), the working tree, and ab/p1, ab/p2, ab/p3 (base + one patch each), first round.
# Logs go straight to $OUT. From the repository root, carry ab and .whl.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
cp $W/gpu.txt $OUT/; W=$OUT
echo "== suite t=$SECONDS"
OUT=$W YOLO_BIMAMBA_AUTOTUNE=0 TEST_TIMEOUT=270 XDIST_N=12 RUN_BENCH=0 TAG_SUFFIX=-s29-all3 \
  bash benchmarks/run_gpu.sh > $W/suite-console.log 2>&1; echo rc=$?; tail -3 $W/suite-console.log
for n in base:ab/base all:. p1:ab/p1 p2:ab/p2 p3:ab/p3; do
  [ $SECONDS -lt 520 ] && PROF_TIMEOUT=$(( 580 - SECONDS )) prof ${n%%:*}-r1 $PWD/${n#*:} --directions both,forward
done
for n in all:. base:ab/base; do
  [ $SECONDS -lt 520 ] && PROF_TIMEOUT=$(( 580 - SECONDS )) prof ${n%%:*}-r2 $PWD/${n#*:} --directions both,forward
done
summary base-r1 all-r1 p1-r1 p2-r1 p3-r1 all-r2 base-r2
echo done t=$SECONDS
