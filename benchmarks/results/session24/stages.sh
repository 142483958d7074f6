#!/bin/bash
# session 24, last call: the backward / forward in-chunk pairs kernels with 2 warps and 1 / 2 / 3 pipeline stages
# (trial configs 3, 4 appended to PAIRS_CONFIGS in ab/v3; config 0 = 2 warps, 3 stages), two rounds. ab/v3 = `git archive
# bcc3cab yolo_bimamba benchmarks/*.py` with `+ [triton.Config({}, num_warps=2, num_stages=ns) for ns in (1, 2)]` added
# to PAIRS_CONFIGS in yolo_bimamba/ops/triton_kernels.py
set -u
export YOLO_BIMAMBA_AUTOTUNE=0 PYTHONUNBUFFERED=1
for r in 1 2; do
  echo "== r$r t=$SECONDS"
  PYTHONPATH=$PWD/ab/v3 timeout 200 python ab/v3/benchmarks/profile_gpu.py kernels --pps 2 --directions both \
    --shapes b16_L1600_h8_p64_n64,b32_L1600_h8_p32_n32,lm_b8_L8192_h32_p64_n128 --pairs-cfgs 0,3,4 --out $OUT/stages-r$r.json > $OUT/stages-r$r.log 2>&1
  echo rc=$?
  python - $OUT/stages-r$r.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    k = r["kernels_ms"]
    print(f'{r["shape"]:26s} pairs_cfg {r["pairs_cfg"]} total {r["total_ms"]:.3f} bwd_pairs {k.get("_bi_ssd_bwd_pairs_kernel", 0):.3f} fwd_pairs {k.get("_bi_ssd_fwd_pairs_kernel", 0):.3f}')
PY
  if [ $SECONDS -gt 200 ]; then break; fi
done
