#!/usr/bin/env bash
# One command for a CUDA machine: the GPU test suite, then the kernel benchmark.
#
#   bash benchmarks/run_gpu.sh          # from anywhere; needs torch + triton + a CUDA GPU, and Ultralytics for the
#                                       # CUDA-graph tests (installed from .whl/ when it is there)
#
# Writes into $OUT when it is set (e.g. the device tool's output folder), else into benchmarks/out/ (git-ignored):
#   gpu-tests-<gpu>.log              python -m pytest -m gpu tests/gpu (pytest-xdist, grouped by compile key, if installed)
#   kernels-<gpu>.json / .md / .png  python benchmarks/bench_kernels.py (bf16, all shapes)
#   bench-<gpu>.log                  the benchmark's console output
# Knobs (environment): TEST_TIMEOUT (s, 600), BENCH_TIMEOUT (s, 600), XDIST_N (8), PYTEST_ARGS, BENCH_ARGS,
# PYTEST_K (a -k expression), RUN_TESTS=0 / RUN_BENCH=0 to skip a part, TAG_SUFFIX (appended to the file names).
# Exit status: non-zero if the tests or the benchmark failed.
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
DEST=${OUT:-benchmarks/out}
mkdir -p "$DEST"
gpu=$(python3 -c "
import torch
n = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'
s = ''.join(c if c.isalnum() else '-' for c in n.lower().replace('nvidia', '').strip()).strip('-')
while '--' in s: s = s.replace('--', '-')
print(s or 'gpu')")
gpu="$gpu${TAG_SUFFIX:-}"
echo "== $(date -u +%FT%TZ) gpu=$gpu dest=$DEST"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | head -3
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

# tests/gpu/test_cuda_graph.py needs Ultralytics (the blocks use its Conv); GPU machines without it get the wheels
# that ../shared/tools/gpu-wheels.sh put in .whl/
if ! python3 -c "import ultralytics" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || echo "== could not install .whl/*.whl"
fi
python3 -c "import ultralytics" 2>/dev/null || echo "== WARNING: no ultralytics: tests/gpu/test_cuda_graph.py is skipped"

test_rc=0
if [ "${RUN_TESTS:-1}" != 0 ]; then
  xdist=""
  if python3 -c "import xdist" 2>/dev/null; then xdist="-n ${XDIST_N:-8} --dist loadgroup"; fi
  t0=$(date +%s)
  timeout "${TEST_TIMEOUT:-600}" python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -v -rA --tb=short --durations=20 \
    $xdist ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} 2>&1 | tee "$DEST/gpu-tests-$gpu.log"
  test_rc=$?
  echo "== GPU tests: rc=$test_rc in $(( $(date +%s) - t0 )) s" | tee -a "$DEST/gpu-tests-$gpu.log"
fi

bench_rc=0
if [ "${RUN_BENCH:-1}" != 0 ]; then
  t0=$(date +%s)
  timeout "${BENCH_TIMEOUT:-600}" python3 benchmarks/bench_kernels.py --out-dir "$DEST" --tag "$gpu" ${BENCH_ARGS:-} 2>&1 \
    | tee "$DEST/bench-$gpu.log"
  bench_rc=$?
  echo "== benchmark: rc=$bench_rc in $(( $(date +%s) - t0 )) s" | tee -a "$DEST/bench-$gpu.log"
fi
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
