#!/bin/bash
# Session 25, third GPU call (H200): the tree (the forward pairs kernel GROUPED from d_state 128, one head per program
# below; the forward kernel's late B load) against cb62c8a (ab/base), per-kernel CUDA time, default configs, one round;
# the GPU kernel suite; the kernel benchmark (autotuned). From the repository root, carry ab and .whl.
set -u
FINAL=$OUT; W=/tmp/w; mkdir -p $W
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $W/gpu.txt
python -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" >> $W/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
S=b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32,lm_b8_L8192_h32_p64_n128
prof() { n=$1; t=$2; shift 2; echo "== $n t=$SECONDS"; YOLO_BIMAMBA_AUTOTUNE=0 PYTHONPATH=$t timeout 200 python \
  $t/benchmarks/profile_gpu.py kernels --pps 2 --shapes $S "$@" --out $W/$n.json > $W/$n.log 2>&1; echo rc=$?; }
prof base $PWD/ab/base --directions both,forward
prof new $PWD --directions both,forward
python - $W <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/{n}.json"))["runs"] for n in ("base", "new"))
for x, y in zip(a, b):
    ks = ", ".join(f'{k[8:]} {v:.3f}->{y["kernels_ms"].get(k, float("nan")):.3f}' for k, v in x["kernels_ms"].items() if k.startswith("_bi"))
    print(f'{x["shape"]:26s} {x["direction"]:8s} total {x["total_ms"]:.3f} -> {y["total_ms"]:.3f}; {ks}')
PY
echo "== tests t=$SECONDS"
YOLO_BIMAMBA_AUTOTUNE=0 PYTHONPATH=/tmp/site:$PWD timeout 240 python -m pytest -m gpu tests/gpu/test_gpu_kernels.py -q -n 8 \
  --dist loadgroup -p no:cacheprovider > $W/gpu-tests-kernels.log 2>&1; echo rc=$?; tail -3 $W/gpu-tests-kernels.log
echo "== bench t=$SECONDS"
PYTHONPATH=/tmp/site:$PWD timeout 200 python benchmarks/bench_kernels.py --out-dir $W --tag h200-s25 --cases triton,triton_forward \
  --budget 0.25 --no-check > $W/bench-h200-s25.log 2>&1; echo rc=$?; tail -25 $W/bench-h200-s25.log
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
