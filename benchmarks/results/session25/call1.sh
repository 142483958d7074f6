#!/bin/bash
# Session 25, first GPU call (H200): A/B of the forward's in-chunk pairs kernel that computes C B^T once per block of a
# group's heads (the tree) against the tree at cb62c8a (ab/base = `git archive cb62c8a yolo_bimamba benchmarks/*.py`)
# and against the tree plus session24/fwd-late-b.patch (ab/v5); per-kernel CUDA time, default configs; the heads per
# program swept; the GPU kernel suite on the tree; a second A/B round if time is left. Everything packed in one
# tarball. From the repository root, carry ab and .whl.
set -u
FINAL=$OUT; W=/tmp/w; mkdir -p $W
export YOLO_BIMAMBA_AUTOTUNE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
python -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" >> $W/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
S=${AB_SHAPES:-b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32,lm_b8_L8192_h32_p64_n128}
. benchmarks/results/session25/lib.sh  # prof, summary
prof base-r1 $PWD/ab/base --directions both,forward
prof new-r1 $PWD --directions both,forward
prof v5-r1 $PWD/ab/v5 --directions both,forward
prof heads $PWD --directions both --fwd-heads 1,2,4,8,32
summary base-r1 new-r1 v5-r1 heads
echo "== tests t=$SECONDS"
PYTHONPATH=/tmp/site:$PWD timeout 230 python -m pytest -m gpu tests/gpu/test_gpu_kernels.py -q -n 8 --dist loadgroup \
  -p no:cacheprovider > $W/gpu-tests-kernels.log 2>&1; echo rc=$?; tail -3 $W/gpu-tests-kernels.log
if [ $SECONDS -lt 420 ]; then
  prof new-r2 $PWD --directions both,forward; prof base-r2 $PWD/ab/base --directions both,forward
  prof v5-r2 $PWD/ab/v5 --directions both,forward; summary base-r2 new-r2 v5-r2
fi
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
