#!/bin/bash
# session 21 (run from the repository root, OUT=<folder>): the split-bf16 state dots as three independent dots summed (variant) against the
# accumulator chain (tree), per-kernel CUDA time, alternating tree / variant / tree / variant; then the variant's
# accuracy and stress cases of the GPU suite
set -u
export YOLO_BIMAMBA_AUTOTUNE=0 PYTHONPATH=$PWD
SH=b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32,lm_b8_L8192_h32_p64_n128
cp yolo_bimamba/ops/triton_kernels.py /tmp/tree_kernels.py
variant() {
  python3 - <<'PY'
from pathlib import Path
p = Path("yolo_bimamba/ops/triton_kernels.py"); t = p.read_text()
a = "return tl.dot(hi, bb, tl.dot(mid, bb, tl.dot(lo, bb)))  # smallest part first, accumulated in the MMA"
b = "return tl.dot(aa, hi, tl.dot(aa, mid, tl.dot(aa, lo)))"
assert a in t and b in t
p.write_text(t.replace(a, "return tl.dot(hi, bb) + (tl.dot(mid, bb) + tl.dot(lo, bb))").replace(b, "return tl.dot(aa, hi) + (tl.dot(aa, mid) + tl.dot(aa, lo))"))
PY
}
for r in 1 2; do
  cp /tmp/tree_kernels.py yolo_bimamba/ops/triton_kernels.py
  timeout 100 python3 benchmarks/profile_gpu.py kernels --pps 2 --directions both --shapes $SH --out $OUT/splitdot-tree-r$r.json 2>&1 | grep "total" | sed 's/prec=None fwd=None bwd=None state=None pairs=None split=None //' | cut -c1-200
  variant
  timeout 100 python3 benchmarks/profile_gpu.py kernels --pps 2 --directions both --shapes $SH --out $OUT/splitdot-var-r$r.json 2>&1 | grep "total" | sed 's/prec=None fwd=None bwd=None state=None pairs=None split=None //' | cut -c1-200
done
timeout 200 python3 -m pytest -m gpu tests/gpu/test_gpu_kernels.py -k "accuracy_and_repeatability or stress" -p no:cacheprovider -q -x 2>&1 | tail -4 > $OUT/gpu-tests-splitdot-var.log
cat $OUT/gpu-tests-splitdot-var.log
cp /tmp/tree_kernels.py yolo_bimamba/ops/triton_kernels.py
