"""Instruction mix of some kernels x configs, compiled for sm_90 on the CPU (the recorder of tests/test_compile_sm90.py,
its variants chosen with SM90_ONLY, bf16): static counts of SASS opcode classes (cuobjdump -sass) per compiled kernel.
From the repository root:

    WANT='{"_bi_ssd_bwd_pairs_kernel": [0, 1], "_bi_ssd_bwd_kernel": [0, 3]}' SM90_ONLY=p64n64-both,p32n32-both \
        python3 benchmarks/results/session21/sass-mix.py OUT.json

(WANT: kernel -> the config indices to compile; every other recorded job is skipped.)"""
import collections, json, os, re, subprocess, sys, tempfile
from pathlib import Path
os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, "tests")
import test_compile_sm90 as T
import triton
CUOBJ = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
WANT = json.loads(os.environ.get("WANT", "{}"))  # kernel -> [config_index or null, ...]
orig = T._compile_job

def classes(sass):
    c = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", line)
        if m:
            op = m.group(1)
            c[op] += 1
    return c

def job(i):
    j = T._JOBS[i]
    if j["kernel"] not in WANT or j["stage"] != "cubin" or j["config_index"] not in WANT[j["kernel"]]:
        return dict(kernel=j["kernel"], skipped=True)
    from triton.compiler import ASTSource
    ck = triton.compile(ASTSource(j["fn"], j["signature"], j["constexprs"], j["attrs"]), target=j["target"], options=j["options"])
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"]); f.flush()
        sass = subprocess.run([CUOBJ, "-sass", f.name], capture_output=True, text=True).stdout
    c = classes(sass)
    groups = {"tensor (HMMA/HGMMA)": ["HMMA", "HGMMA"], "shared ld/st": ["LDS", "STS", "LDSM", "STSM"],
              "barrier": ["BAR", "WARPSYNC"], "shuffle": ["SHFL"], "global ld/st": ["LDG", "STG", "LD", "ST", "RED", "ATOM", "ATOMG"],
              "MUFU (exp etc.)": ["MUFU"], "fp32 arith": ["FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL"],
              "convert": ["F2F", "F2FP", "I2F", "F2I"], "int/addr": ["IADD3", "IMAD", "LEA", "SHF", "LOP3", "ISETP", "SEL", "MOV", "IMNMX", "PRMT"]}
    g = {k: sum(c[o] for o in ops) for k, ops in groups.items()}
    names = list(j["fn"].arg_names)
    consts = {names[k[0]]: v for k, v in j["constexprs"].items() if isinstance(k, tuple) and k and k[0] < len(names)}
    return dict(kernel=j["kernel"], variant=j["variant"], block_q=consts.get("BLOCK_Q"), block_p=consts.get("BLOCK_P"),
                num_warps=j["options"].get("num_warps"), config=j["config"], config_index=j["config_index"], total=sum(c.values()),
                groups=g, regs=T._resource_usage(ck.asm["cubin"]), shared=int(ck.metadata.shared),
                top=c.most_common(25))

T._compile_job = job
T._worker(sys.argv[1], ["bf16"])
rep = json.loads(Path(sys.argv[1]).read_text())
for r in rep["results"]:
    if not r.get("skipped"):
        print(r["variant"], r["kernel"], "cfg", r["config_index"], "BLOCK_Q", r["block_q"], "BLOCK_P", r["block_p"], "warps", r["num_warps"],
              "total", r["total"], "regs", r["regs"], "shared", r["shared"])
        print("   ", r["groups"])
