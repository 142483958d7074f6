"""Session 28: registers and stack bytes (sm_90, from cuobjdump) of the backward segment and state kernels x configs
at headdim 64 x d_state 128 (bf16, both directions, softplus and bias) for the tree in $TREE, with the recorder of
tests/test_compile_sm90.py. Run with the H200's Triton (3.6.0) to see what the device compiles:

    TREE=/path/to/tree TRITON_INTERPRET=0 python benchmarks/results/session28/stack_counts.py OUT.json
"""
import json
import os
import sys
from pathlib import Path

TREE = os.environ["TREE"]
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
sys.path.insert(0, TREE)
import test_compile_sm90 as T  # noqa: E402

both = dict(direction="both", D="h", dt_bias=True, dt_softplus=True)
T._variants = lambda: [("p64n128", 64, 128, 1, 8, both, ("bf16",), "cubin")]
T._worker(sys.argv[1], ["bf16"])
for r in json.load(open(sys.argv[1]))["results"]:
    if "ssd_bwd_kernel" in r["kernel"] or "state" in r["kernel"]:
        print(r["variant"], r["kernel"], r.get("config_index"), "regs", r.get("regs"), "stack", r.get("stack"))
