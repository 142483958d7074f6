#!/bin/bash
# GPU training runs and benchmarks. On a CUDA machine with torch + triton (Ultralytics wheels in .whl/, made by
# ../shared/tools/gpu-wheels.sh), from the repository root:
#   bash benchmarks/gpu_train.sh install            # pip-install the wheels and this package, as a user would
#   GPU=1 EPOCHS=15 bash benchmarks/gpu_train.sh runs  # yolov8n-bimamba fp32 / bf16 / fp16 AMP (RUNS_N=0: skip them)
#                                                     # + RUNS_EXTRA="NAME:MODEL:AMP ..."; PACK_TAG names the tgz
#   PAR="NAME:MODEL:AMP:GPU[:k=v,k=v] ..." bash benchmarks/gpu_train.sh matrix  # all those runs at once, one tgz
#   bash benchmarks/gpu_train.sh ddp                # 2-GPU DDP: the stock `yolo` CLI and train.py
#   bash benchmarks/gpu_train.sh bench              # benchmarks/bench_train.py (BENCH_ARGS, default --onnx)
# Results go to $OUT (default benchmarks/out, git-ignored): train-<mode>.tgz (results.csv, curves, args; no weights)
# and logs.
set -uo pipefail
MODE=${1:?usage: gpu_train.sh install|runs|matrix|ddp|bench}
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$REPO/benchmarks/out}
mkdir -p "$OUT"
export YOLO_OFFLINE=1 YOLO_AUTOINSTALL=0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export YOLO_BIMAMBA_CACHE=/tmp/ybm-cache YOLO_CONFIG_DIR=/tmp/ybm-config
export PATH="$(dirname "$(command -v python3)"):$PATH"
EP=${EPOCHS:-15}
RUNS=/tmp/ybm-runs
mkdir -p "$RUNS"

train() {  # train NAME ARGS... : one train.py run, log kept next to its results
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$(date +%s)
  python3 "$REPO/train.py" project="$RUNS" name="$name" exist_ok=True epochs="$EP" imgsz=160 batch="${BATCH:-16}" \
    workers="${WORKERS:-8}" "$@" > "$RUNS/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc in $(( $(date +%s) - t0 )) s; $(grep -E 'mAP50 first' "$RUNS/$name.log" | tail -1)"
  grep -E "nan_guard: " "$RUNS/$name.log" | tail -3
  [ "${COPY_LOGS:-1}" = 0 ] || cp "$RUNS/$name.log" "$OUT/" 2>/dev/null  # matrix: the logs travel in the tgz
}

# what comes back from the GPU machine: per run results.csv, args.yaml, results.png and the log (a whole run folder
# with its plots came to 21 MB for four runs, over the device tool's 16 MB per file)
pack() {
  (cd "$(dirname "$RUNS")" && find "$(basename "$RUNS")" \( -name results.csv -o -name args.yaml -o -name results.png \
    -o -name '*.log' \) -print0 | tar czf "$OUT/train-$1.tgz" --null -T -)
}

case $MODE in
  install)
    python3 -m pip install -q --no-index --no-deps --no-compile "$REPO"/.whl/*.whl || exit 1
    python3 -m pip install -q --no-index --no-deps --no-build-isolation "$REPO" || exit 1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    python3 -c "import torch, triton, ultralytics, yolo_bimamba; print('torch', torch.__version__, 'triton', triton.__version__, 'ultralytics', ultralytics.__version__, 'gpus', torch.cuda.device_count())" | tee -a "$OUT/gpu.txt"
    (cd /tmp && python3 -m yolo_bimamba.data) ;;  # build the default dataset once
  runs)
    export CUDA_VISIBLE_DEVICES=${GPU:-0}
    if [ "${RUNS_N:-1}" != 0 ]; then  # RUNS_N=0: only the RUNS_EXTRA runs
      train n-bimamba-fp32 model=yolov8n-bimamba.yaml amp=False
      train n-bimamba-bf16 model=yolov8n-bimamba.yaml amp=bf16
      train n-bimamba-fp16 model=yolov8n-bimamba.yaml amp=True
    fi
    for spec in ${RUNS_EXTRA:-}; do  # NAME:MODEL:AMP
      IFS=: read -r name model amp <<< "$spec"
      train "$name" model="$model" amp="$amp"
    done
    pack "runs-gpu${GPU:-0}${PACK_TAG:-}" ;;
  matrix)  # every PAR run at the same time (GPU picks the card), then one tgz; RUN_TIMEOUT caps each run
    export COPY_LOGS=0  # the device tool returns at most 8 files
    for spec in ${PAR:?PAR=\"NAME:MODEL:AMP:GPU[:k=v,...] ...\"}; do
      IFS=: read -r name model amp gpu extra <<< "$spec"
      (export CUDA_VISIBLE_DEVICES=$gpu; train "$name" model="$model" amp="$amp" ${extra//,/ }) &
    done
    wait
    pack "matrix${PACK_TAG:-}" ;;
  ddp)  # both runs at once, each on both GPUs (Ultralytics picks a free port per run)
    echo "=== DDP: stock yolo CLI and train.py, device=0,1"
    (cd /tmp && yolo train model=yolov8n-bimamba.yaml data=digits.yaml device=0,1 epochs="${DDP_EPOCHS:-2}" imgsz=160 \
      batch=32 workers=4 project="$RUNS" name=ddp-cli exist_ok=True > "$RUNS/ddp-cli.log" 2>&1; echo "ddp-cli exit $?") &
    (cd /tmp && python3 "$REPO/train.py" model=yolov8n-bimamba.yaml device=0,1 epochs="${DDP_EPOCHS:-2}" batch=32 \
      workers=4 project="$RUNS" name=ddp-trainpy exist_ok=True > "$RUNS/ddp-trainpy.log" 2>&1; echo "ddp-train.py exit $?") &
    wait
    tail -n 3 "$RUNS/ddp-cli.log" "$RUNS/ddp-trainpy.log"
    cp "$RUNS"/ddp-*.log "$OUT/"
    pack ddp ;;
  bench)
    (cd "$REPO" && python3 benchmarks/bench_train.py ${BENCH_ARGS:---onnx} --out "$OUT" 2>&1 | tee "$OUT/bench_train.log") ;;
  *) echo "unknown mode $MODE"; exit 2 ;;
esac
