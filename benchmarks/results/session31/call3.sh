#!/bin/bash
# Session 31, third GPU call: the backward's ordered group rows (YOLO_BIMAMBA_ORDERED_ROWS=1, the memory mode) against
# the default per-head rows on the current kernels: per-kernel CUDA time at default configs, both directions, three
# shapes, two rounds in mirrored order (0, 1, 1, 0). From the repository root, with LIMIT=<timeout_s>.
set -u
LIMIT=${LIMIT:-590}
. benchmarks/results/session26/lib.sh  # start_call, env_rounds
start_call
env_rounds YOLO_BIMAMBA_ORDERED_ROWS ord0-r1:0 ord1-r1:1 ord1-r2:1 ord0-r2:0
tar -C $W -cf $FINAL/call3.tar . && echo packed t=$SECONDS
