"""profile_gpu.py with one more backward config, (BLOCK_Q 64, 8 warps, 1 stage), allowed at any headdim / d_state
(index 4): an LM-shape experiment, not a config of the package."""
import runpy, sys
import triton
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from bench_kernels import _enter_package_without_glue  # noqa: E402

_enter_package_without_glue()
import yolo_bimamba.ops.triton_kernels as K  # noqa: E402

K.BWD_CONFIGS.append(triton.Config({"BLOCK_Q": 64}, num_warps=8, num_stages=1))
K.bwd_config_fits = lambda cfg, P, N: True
sys.argv = ["benchmarks/profile_gpu.py"] + sys.argv[1:]
runpy.run_path("benchmarks/profile_gpu.py", run_name="__main__")
