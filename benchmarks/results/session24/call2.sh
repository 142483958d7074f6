#!/bin/bash
# session 24, second call: final A/B vs d9c005c + GPU kernel suite (ab.sh), v2 (early dC rows in the anti-causal
# launch's pass A) against the tree at the LM shape, then the forward's configs 1 and 2 at the LM shape; everything packed into one tarball.
# From the repository root at bcc3cab, with ab/base = `git archive d9c005c yolo_bimamba benchmarks/*.py` and ab/v2 = the
# tree's yolo_bimamba and benchmarks/*.py with benchmarks/results/session24/dcA-early.patch applied (carry ab and .whl)
set -u
FINAL=$OUT; W=/tmp/w; mkdir -p $W
OUT=$W AB_SHAPES=b16_L1600_h8_p64_n64,lm_b8_L8192_h32_p64_n128 AB_ROUND2_BEFORE=0 bash benchmarks/results/session23/ab.sh
export YOLO_BIMAMBA_AUTOTUNE=0 PYTHONUNBUFFERED=1
lm() { echo "== $1 t=$SECONDS"; PYTHONPATH=$2 timeout 100 python $2/benchmarks/profile_gpu.py kernels --pps 2 --directions both \
  --shapes lm_b8_L8192_h32_p64_n128 --out $W/$1.json > $W/$1.log 2>&1; echo rc=$?; }
lm v2-r1 $PWD/ab/v2; lm new-lm-r2 $PWD; lm v2-r2 $PWD/ab/v2
python - $W <<'PY'
import json, sys
for n in ("new-r1", "v2-r1", "new-lm-r2", "v2-r2"):
    try:
        for r in json.load(open(f"{sys.argv[1]}/{n}.json"))["runs"]:
            if r["shape"].startswith("lm"):
                print(n, r["direction"], r["total_ms"], {k[8:]: v for k, v in r["kernels_ms"].items() if k.startswith("_bi")})
    except Exception as e:
        print(n, "missing", e)
PY
echo "== fwd cfgs t=$SECONDS"
PYTHONPATH=$PWD timeout 150 python benchmarks/profile_gpu.py kernels --pps 2 --directions both,forward --shapes lm_b8_L8192_h32_p64_n128 \
  --fwd-cfgs 1,2 --out $W/fwdcfg.json > $W/fwdcfg.log 2>&1; echo rc=$?
python - $W/fwdcfg.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    print(r["direction"], r["fwd_cfg"], r["total_ms"], {k[8:]: v for k, v in r["kernels_ms"].items() if k.startswith("_bi")})
PY
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
