#!/bin/bash
# Session 28, third GPU call (H200): with the processed dt (the tree of the second call), the host-chosen knobs again,
# since the pairs kernels lost the softplus and its registers: the backward pairs kernel's AHEAD (2, 3) and configs
# (2 / 4 / 8 warps), the backward segment kernel's AHEAD (0, 2, 3, 7); per-kernel CUDA time, default configs
# otherwise, both directions and one, two rounds. From the repository root.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof
start_call
prof pa-r1 $PWD --directions both,forward --pairs-ahead 2,3
prof pc-r1 $PWD --directions both,forward --pairs-cfgs 0,1,2
prof ba-r1 $PWD --directions both,forward --bwd-ahead 0,2,3,7
[ $SECONDS -lt 330 ] && prof pa-r2 $PWD --directions both,forward --pairs-ahead 3,2
[ $SECONDS -lt 380 ] && prof pc-r2 $PWD --directions both,forward --pairs-cfgs 2,1,0
[ $SECONDS -lt 400 ] && PROF_TIMEOUT=120 prof ba-r2 $PWD --directions both,forward --bwd-ahead 7,3,2,0
python - $W <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(sys.argv[1] + "/*-r[12].json")):
    for r in json.load(open(f))["runs"]:
        k = r["kernels_ms"]
        print(f'{os.path.basename(f)[:-5]:6s} {r["shape"][:13]:13s} {r["direction"][:4]} pa={r.get("pairs_ahead")} pc={r.get("pairs_cfg")} '
              f'ba={r.get("bwd_ahead")} tot {r["total_ms"]:.3f} bwd {k.get("_bi_ssd_bwd_kernel", 0):.3f} '
              f'bp {k.get("_bi_ssd_bwd_pairs_kernel", 0):.3f} fp {k.get("_bi_ssd_fwd_pairs_kernel", 0):.3f}')
PY
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
