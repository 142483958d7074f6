#!/bin/bash
# Session 28, first GPU call (H200): session 27's two CPU-prepared candidates against the tree at 37f86c8
# (ab/base = git archive 37f86c8 yolo_bimamba benchmarks/*.py): ab/pdt = base + session27/processed-dt.patch, the
# working tree = base + processed-dt.patch + update-weight.patch. Per-kernel CUDA time at default configs, three
# shapes, both directions and one, two rounds in mirrored order; then the whole GPU suite on the working tree.
# From the repository root, carry ab and .whl.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
prof base-r1 $PWD/ab/base --directions both,forward
prof pdt-r1 $PWD/ab/pdt --directions both,forward
prof both-r1 $PWD --directions both,forward
prof both-r2 $PWD --directions both,forward
prof pdt-r2 $PWD/ab/pdt --directions both,forward
prof base-r2 $PWD/ab/base --directions both,forward
summary base-r1 pdt-r1 both-r1 both-r2 pdt-r2 base-r2
echo "== suite t=$SECONDS"
OUT=$W YOLO_BIMAMBA_AUTOTUNE=0 TEST_TIMEOUT=$(( 580 - SECONDS )) XDIST_N=12 RUN_BENCH=0 TAG_SUFFIX=-s28-both \
  bash benchmarks/run_gpu.sh > $W/suite-console.log 2>&1; echo rc=$?; tail -4 $W/suite-console.log
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
