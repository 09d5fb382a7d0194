#!/bin/bash
# device call (2026-12-05 fifth session): GPT-2 training with is_causal (681ad8d), then
# training steps of the chain suite through the backend against Inductor (83ad100).
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt"
git log --oneline -1 >> "$OUT/gpu.txt" 2>/dev/null; date -u >> "$OUT/gpu.txt"
echo "== jit_gpt2_training"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/jg PYTHONPATH=src timeout 230 python \
  benchmarks/jit_gpt2_training.py --out "$OUT/jit_gpt2_training.jsonl" > "$OUT/jit_gpt2_training.log" 2>&1
echo "rc $?"
t() { local c=$1 lim=$2; echo "== $c"; date -u
  NEPTUNE_FUSION_LOG=1 NEPTUNE_FUSION_CACHE_DIR=/tmp/jt PYTHONPATH=src timeout $lim python \
    benchmarks/jit_training.py --chains $c --dtypes bfloat16 --out "$OUT/jit_training.jsonl" \
    >> "$OUT/jit_training.log" 2>&1; echo "rc $?"; }
t rmsnorm-matmul,layernorm-matmul 100
t softmax,log-softmax 90
date -u
grep -h '^{' "$OUT/jit_gpt2_training.log" "$OUT/jit_training.log" | cut -c1-240
