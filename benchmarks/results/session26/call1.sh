#!/bin/bash
# Session 26, first GPU call (H200): A/B of the backward pairs kernel's AHEAD bits (1: each head's inputs one head
# ahead; 2: the rows it adds to loaded before its products) in the tree, against the tree at df92816 (ab/base = `git
# archive df92816 yolo_bimamba benchmarks/*.py`), per-kernel CUDA time, default configs, two rounds; AHEAD 0 and 3
# with the pairs kernel's configs 0 and 1 (2 and 4 warps). From the repository root, carry ab.
set -u
. benchmarks/results/session26/lib.sh  # start_call, prof, summary
start_call
prof base-r1 $PWD/ab/base --directions both,forward
prof new-r1 $PWD --directions both,forward --pairs-ahead 0,1,2,3
prof pcfg $PWD --directions both --pairs-ahead 0,3 --pairs-cfgs 0,1
prof new-r2 $PWD --directions both,forward --pairs-ahead 3,0
prof base-r2 $PWD/ab/base --directions both,forward
summary base-r1 new-r1 pcfg new-r2 base-r2
cd $W && tar czf $FINAL/all.tgz . && echo packed t=$SECONDS
