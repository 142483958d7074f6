#!/bin/bash
# Session 26, third GPU call (H200): A/B of the forward's loads ahead (triton_op.fwd_ahead_bits: 1, the forward
# kernel's dt, x, C one chunk ahead; 2, its anti-causal pass reads y before the chunk's products; 4, the forward pairs
# kernel reads y with the head's inputs) in the tree, against the tree at df92816 (ab/base), per-kernel CUDA time,
# default configs; both directions two rounds, one direction one. From the repository root, carry ab.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
prof fbase-r1 $PWD/ab/base --directions both,forward
prof fa-r1 $PWD --directions both --fwd-ahead 0,1,2,3,4,7
prof fa-fwd $PWD --directions forward --fwd-ahead 0,1,4,5
prof fa-r2 $PWD --directions both --fwd-ahead 7,4,3,0
summary fbase-r1 fa-r1 fa-fwd fa-r2
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
