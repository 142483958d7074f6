#!/bin/bash
# Session 25, second GPU call (H200): A/B of the forward pairs kernel that loads each head's inputs one head ahead (the
# tree, with session24/fwd-late-b.patch applied to the forward kernel) against the tree at cb62c8a (ab/base) and against
# cb62c8a plus the late B load alone (ab/v6 = `git archive cb62c8a yolo_bimamba benchmarks/*.py`, patched, with the
# tree's profile_gpu.py); the heads per program swept; two rounds. From the repository root, carry ab.
set -u
FINAL=$OUT; W=/tmp/w; mkdir -p $W
export YOLO_BIMAMBA_AUTOTUNE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
python -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" >> $W/gpu.txt
S=${AB_SHAPES:-b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32,lm_b8_L8192_h32_p64_n128}
. benchmarks/results/session25/lib.sh  # prof, summary
prof base-r1 $PWD/ab/base --directions both,forward
prof v6-r1 $PWD/ab/v6 --directions both,forward
prof new-r1 $PWD --directions both,forward
prof heads $PWD --directions both --fwd-heads 1,2,4,8,32
prof heads-fwd $PWD --directions forward --fwd-heads 1,4,8,32
prof new-r2 $PWD --directions both,forward
prof v6-r2 $PWD/ab/v6 --directions both,forward
prof base-r2 $PWD/ab/base --directions both,forward
summary base-r1 v6-r1 new-r1 heads heads-fwd base-r2 v6-r2 new-r2
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
