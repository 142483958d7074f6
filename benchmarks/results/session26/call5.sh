#!/bin/bash
# Session 26, fifth GPU call (H200, the fourth call's machine, still warm): the kernel benchmark that the fourth call's
# time limit cut (call4.sh ran out of time during it, and its files did not come back), with a shorter budget per
# case (0.2 s instead of 0.25), then the fourth call's files, still in /tmp/w, packed. From the repository root.
W=/tmp/w; ls $W | head -30; OUT2=$OUT; OUT=$W RUN_TESTS=0 BENCH_TIMEOUT=140 TAG_SUFFIX=-s26-final BENCH_ARGS="--cases triton,triton_forward --budget 0.2 --no-check" bash benchmarks/run_gpu.sh > /dev/null 2>&1; echo rc=$?; tail -3 $W/bench-h200-s26-final.log; cd $W && tar czf $OUT2/all.tgz . && echo packed
