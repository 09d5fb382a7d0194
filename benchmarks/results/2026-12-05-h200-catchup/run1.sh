#!/bin/bash
# Device call 1 (2026-12-05): nan_check; chain suite A/B: bf16 all chains 291c7e6 (c0) vs tree,
# fp32 centred chains HEAD (c1) vs tree.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
python -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $OUT/gpu.txt
date -u >> $OUT/gpu.txt
echo "== nan_check"; PYTHONPATH=src timeout 150 python benchmarks/nan_check.py > $OUT/nan_check.jsonl 2>&1; echo "rc $?"; tail -2 $OUT/nan_check.jsonl
bench() { # name src extra-args...
  local name=$1 src=$2; shift 2
  echo "== $name"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-$name PYTHONPATH=$src timeout 220 python -m neptune_fusion.bench --suite chains --providers neptune,torch-compile --timer graph --no-plots --out /tmp/$name "$@" > /tmp/$name.log 2>&1; echo "rc $?"
  tail -3 /tmp/$name.log
  f=$(find /tmp/$name -name report.md | head -1); cp $f $OUT/$name-report.md
}
bench bf16-before .gpu/c0/src --dtype bfloat16
bench bf16-after src --dtype bfloat16
bench f32-before .gpu/c1/src --dtype float32 --ops variance,layer-stats,layernorm-matmul
bench f32-after src --dtype float32 --ops variance,layer-stats,layernorm-matmul
date -u
