#!/bin/bash
# Session 30, first GPU call: the batch sums of dA, d dt_bias, dD in one Triton launch (_bi_ssd_grad_sums_kernel,
# commit 2f5027c) against base e54bd9c (the torch reductions it replaces). The whole GPU suite (default configs) on
# the new tree; per-kernel CUDA time (default configs, three shapes, both directions and one) of ab/base and the tree
# in mirrored order (base, new, new, base); then the benchmark's triton case at b16 L1600 h8 (ordinary launches and
# CUDA-graph replay, default configs) in the same mirrored order. Everything is packed into one tar.
# From the repository root, with LIMIT=<timeout_s> (TEST_TIMEOUT, PROF_MARGIN: the suite's limit and the seconds kept
# after the profiles), carry ab and .whl.
set -u
LIMIT=${LIMIT:-590}
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
echo "== suite t=$SECONDS"
OUT=$W YOLO_BIMAMBA_AUTOTUNE=0 TEST_TIMEOUT=${TEST_TIMEOUT:-260} XDIST_N=12 RUN_BENCH=0 TAG_SUFFIX=-s30 \
  bash benchmarks/run_gpu.sh > $W/suite-console.log 2>&1; echo rc=$?; tail -3 $W/suite-console.log
for n in base-r1:ab/base new-r1:. new-r2:. base-r2:ab/base; do
  [ $SECONDS -lt $(( LIMIT - ${PROF_MARGIN:-150} )) ] && PROF_TIMEOUT=$(( LIMIT - ${PROF_MARGIN:-150} + 30 - SECONDS )) prof ${n%%:*} $PWD/${n#*:} --directions both,forward
done
summary base-r1 new-r1 new-r2 base-r2 | tee $W/summary.txt
for n in base-b1:ab/base new-b1:. new-b2:. base-b2:ab/base; do
  [ $SECONDS -lt $(( LIMIT - 45 )) ] || continue
  echo "== $n t=$SECONDS"
  YOLO_BIMAMBA_AUTOTUNE=0 PYTHONPATH=$PWD/${n#*:} timeout $(( LIMIT - 25 - SECONDS )) python ${n#*:}/benchmarks/bench_kernels.py \
    --cases triton --shapes b16_L1600_h8 --budget 3 --no-check --out-dir $W/${n%%:*} --tag ${n%%:*} > $W/${n%%:*}.log 2>&1
  echo rc=$?; grep -h "triton" $W/${n%%:*}.log | tail -4
done
cat $W/gpu.txt
tar -C $W -cf $OUT/call1.tar . && echo done t=$SECONDS
