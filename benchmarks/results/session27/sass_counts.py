"""Session 27: static sm_90 SASS instruction counts (NOPs left out) of every SSD kernel x config the op launches at
headdim x d_state 64 x 64, 32 x 32 and 64 x 128 (bf16, both directions, softplus and bias), for the tree in $TREE,
with the recorder of tests/test_compile_sm90.py and the cuobjdump of the Triton wheel. Run with the H200's Triton
(3.6.0) to see what the device compiles:

    TREE=/path/to/tree python benchmarks/results/session27/sass_counts.py OUT.json
"""
import os, sys, json, subprocess, tempfile, re
from pathlib import Path

TREE = os.environ["TREE"]
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
sys.path.insert(0, TREE)
import test_compile_sm90 as T
both = dict(direction="both", D="h", dt_bias=True, dt_softplus=True)
T._variants = lambda: [("p64n64", 64, 64, 1, 8, both, ("bf16",), "cubin"), ("p32n32", 32, 32, 1, 8, both, ("bf16",), "cubin"),
                       ("p64n128", 64, 128, 1, 8, both, ("bf16",), "cubin")]
def job(i):
    j = T._JOBS[i]
    if "ssd" not in j["kernel"]:
        return dict(kernel=j["kernel"], skipped=True)
    import triton
    from triton.compiler import ASTSource
    src = ASTSource(j["fn"], j["signature"], j["constexprs"], j["attrs"])
    ck = triton.compile(src, target=j["target"], options=j["options"])
    exe = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"]); f.flush()
        out = subprocess.run([exe, "-sass", f.name], capture_output=True, text=True).stdout
    ins = [l for l in out.splitlines() if re.match(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", l) and "NOP" not in l]
    return dict(kernel=j["kernel"], variant=j["variant"], cfg=j["config_index"], n=len(ins), skipped=False)
T._compile_job = job
T._worker(sys.argv[1], ["bf16"])
for r in json.load(open(sys.argv[1]))["results"]:
    if not r.get("skipped"): print(r["variant"], r["kernel"], r["cfg"], r.get("n"))
