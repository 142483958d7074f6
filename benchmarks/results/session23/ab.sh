#!/bin/bash
# Session 23's A/B on the H200: the tree against ab/base, an earlier commit's package and benchmarks
# (`mkdir -p ab/base && git archive REV yolo_bimamba benchmarks | tar -x -C ab/base`; carry ab and .whl), per-kernel
# CUDA time with default configs, two rounds around the GPU kernel suite. From the repository root:
#   REV 6aaa7bb: AB_ARGS="--pairs-cfgs 0,1" bash benchmarks/results/session23/ab.sh   (the pairs kernel, 016fb14)
#   REV ad556c3: bash benchmarks/results/session23/ab.sh                               (the state updates, 679d1ea)
#   REV d9c005c: AB_SHAPES=b16_L1600_h8_p64_n64,lm_b8_L8192_h32_p64_n128 AB_ARGS="--directions both,forward" \
#                AB_ROUND2_BEFORE=400 bash benchmarks/results/session23/ab.sh   (session 24: the backward's dC / dB rows)
# (The calls ran two copies of this script that differed only in those arguments and in what the summary printed.)
set -u
export YOLO_BIMAMBA_AUTOTUNE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" >> $OUT/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
S=${AB_SHAPES:-b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32,lm_b8_L8192_h32_p64_n128}
run() { echo "== $1 $(date +%T) t=$SECONDS"; }
ab() {
  run base-r$1; PYTHONPATH=$PWD/ab/base timeout 150 python ab/base/benchmarks/profile_gpu.py kernels --pps 2 --directions both \
    ${AB_ARGS:-} --shapes $S --out $OUT/base-r$1.json > $OUT/base-r$1.log 2>&1; echo rc=$?
  run new-r$1; PYTHONPATH=$PWD timeout 150 python benchmarks/profile_gpu.py kernels --pps 2 --directions both \
    ${AB_ARGS:-} --shapes $S --out $OUT/new-r$1.json > $OUT/new-r$1.log 2>&1; echo rc=$?
  python - $OUT/base-r$1.json $OUT/new-r$1.json <<'PY'
import json, sys
a, b = (json.load(open(f))["runs"] for f in sys.argv[1:])
for x, y in zip(a, b):
    ks = ", ".join(f'{k[8:]} {v:.3f}->{y["kernels_ms"].get(k, float("nan")):.3f}' for k, v in x["kernels_ms"].items() if k.startswith("_bi"))
    print(f'{x["shape"]:26s} {x["direction"]:8s} total {x["total_ms"]:.3f} -> {y["total_ms"]:.3f}; {ks}')
PY
}
ab 1
run tests; PYTHONPATH=/tmp/site:$PWD timeout 330 python -m pytest -m gpu tests/gpu/test_gpu_kernels.py -q -n 8 --dist loadgroup -p no:cacheprovider > $OUT/gpu-tests.log 2>&1; echo rc=$?; tail -5 $OUT/gpu-tests.log
[ $SECONDS -lt ${AB_ROUND2_BEFORE:-480} ] && ab 2
run end
