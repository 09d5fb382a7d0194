set -u
export PYTHONUNBUFFERED=1 NEPTUNE_FUSION_LOG=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt"
run() { # name src dtype ops providers
  echo "== $1"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/c-$1 PYTHONPATH=$2 timeout 170 python -m neptune_fusion.bench \
    --ops $4 --seqs 16384,4096 --providers $5 --dtype $3 --no-plots --out /tmp/$1 \
    > "$OUT/$1-log.txt" 2>&1; echo "rc $?"
  cp /tmp/$1/report.md "$OUT/$1-report.md"; cp /tmp/$1/results.json "$OUT/$1.json"
  grep -E "^\| PF-" "$OUT/$1-report.md" | grep neptune | cut -c1-200
}
run before-f16 .gpu/before/src float16 PF-ALiBi neptune,flex
run after-f16 src float16 PF-ALiBi neptune,flex
run after-bf16 src bfloat16 PF-ALiBi,PF-Causal neptune,sdpa-cudnn,flex
