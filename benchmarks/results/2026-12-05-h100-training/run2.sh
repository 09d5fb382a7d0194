#!/bin/bash
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu2.txt"
NEPTUNE_FUSION_CACHE_DIR=/tmp/jp PYTHONPATH=src timeout 200 python benchmarks/jit_training_profile.py \
  --chains softmax,layernorm-matmul > "$OUT/jit_training_profile.txt" 2>&1
echo "rc $?"
grep "^==" "$OUT/jit_training_profile.txt"
