#!/bin/bash
# Session 32, first GPU call: the backward segment kernel's inputs through tensor descriptors (YOLO_BIMAMBA_TMA=1)
# against pointer loads (0): gradients bit for bit under every backward config (tma_check.py), then per-kernel CUDA
# time at default configs, both directions, three shapes, two rounds in mirrored order (0, 1, 1, 0). From the
# repository root, with LIMIT=<timeout_s>.
set -u
LIMIT=${LIMIT:-590}
. benchmarks/results/session26/lib.sh  # start_call, env_rounds
start_call
timeout 200 python benchmarks/results/session32/tma_check.py > $W/tma-check.log 2>&1; echo "check rc=$? t=$SECONDS"
tail -3 $W/tma-check.log
env_rounds YOLO_BIMAMBA_TMA tma0-r1:0 tma1-r1:1 tma1-r2:1 tma0-r2:0
tar -C $W -cf $FINAL/call1.tar . && echo packed t=$SECONDS
