#!/bin/bash
# GPU training evidence (issue 6), one command on a 2-GPU machine (device kind nvidia-h200-x2):
#   bash benchmarks/gpu_train.sh [runs|bench|all]
# Needs the Ultralytics wheels in .whl/ (../shared/tools/gpu-wheels.sh) on a machine with torch + triton.
# Installs them and this package (as a user would: pip install, so the stock `yolo` CLI sees our blocks),
# then: "runs"  = training runs of yolov8n-bimamba in fp32 / bf16 AMP / fp16 AMP, the yolov8n baseline and the
#                 s pair with the same recipe, and a DDP run on 2 GPUs through the stock `yolo` CLI and train.py;
#       "bench" = benchmarks/bench_train.py --onnx --loop.
# Everything lands in $OUT (default ./gpu-out) as one archive plus the logs.
set -uo pipefail
MODE=${1:-all}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export YOLO_OFFLINE=1 YOLO_AUTOINSTALL=0 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export YOLO_BIMAMBA_CACHE=/tmp/ybm-cache YOLO_CONFIG_DIR=/tmp/ybm-config
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation . || exit 1
BIN=$(dirname "$(command -v python3)")
export PATH="$BIN:$PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, ultralytics; print('torch', torch.__version__, 'triton', triton.__version__, 'ultralytics', ultralytics.__version__)" | tee -a "$OUT/gpu.txt"
cd /tmp
EP=${EPOCHS:-30}
run() {  # run NAME GPU ARGS...
  local name=$1 gpu=$2; shift 2
  echo "=== $name (GPU $gpu): $*"
  CUDA_VISIBLE_DEVICES=$gpu python3 "$OLDPWD/train.py" project=/tmp/runs name="$name" exist_ok=True epochs=$EP imgsz=160 batch=64 workers=8 seed=0 deterministic=False "$@" > "/tmp/runs-$name.log" 2>&1
  echo "=== $name exit $? ; $(grep -E 'mAP50 first|guard' /tmp/runs-$name.log | tail -2)"
}
if [[ $MODE == runs || $MODE == all ]]; then
  mkdir -p /tmp/runs
  python3 -m yolo_bimamba.data > /dev/null 2>&1 || true   # build the default dataset once
  ( run n-bimamba-fp32 0 model=yolov8n-bimamba.yaml amp=False; run n-bimamba-fp16 0 model=yolov8n-bimamba.yaml amp=True;
    run s-bimamba-bf16 0 model=yolov8s-bimamba.yaml amp=bf16 ) &
  ( run n-bimamba-bf16 1 model=yolov8n-bimamba.yaml amp=bf16; run n-plain-bf16 1 model=yolov8n.yaml amp=bf16;
    run s-plain-bf16 1 model=yolov8s.yaml amp=bf16 ) &
  wait
  echo "=== DDP: stock yolo CLI, device=0,1"
  yolo train model=yolov8n-bimamba.yaml data=digits.yaml device=0,1 epochs=3 imgsz=160 batch=64 workers=4 project=/tmp/runs name=ddp-cli exist_ok=True > /tmp/runs-ddp-cli.log 2>&1
  echo "ddp-cli exit $?"; tail -5 /tmp/runs-ddp-cli.log
  echo "=== DDP: train.py device=0,1"
  python3 "$OLDPWD/train.py" model=yolov8n-bimamba.yaml device=0,1 epochs=3 batch=64 workers=4 project=/tmp/runs name=ddp-trainpy exist_ok=True > /tmp/runs-ddp-trainpy.log 2>&1
  echo "ddp-train.py exit $?"; tail -5 /tmp/runs-ddp-trainpy.log
  cp /tmp/runs-*.log /tmp/runs/ 2>/dev/null
  tar czf "$OUT/train-runs.tgz" --exclude='*.pt' --exclude='*.jpg' -C /tmp runs
fi
if [[ $MODE == bench || $MODE == all ]]; then
  cd "$OLDPWD"
  python3 benchmarks/bench_train.py --onnx --loop --out "$OUT" 2>&1 | tee "$OUT/bench_train.log"
fi
ls -la "$OUT"
