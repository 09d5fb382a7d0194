set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt"
for dt in float16 bfloat16; do
  echo "== bench prefill $dt"; date -u
  NEPTUNE_FUSION_LOG=1 NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-prefill PYTHONPATH=src timeout 275 python -m \
    neptune_fusion.bench --ops PF-Global,PF-Causal,PF-GQA,PF-ALiBi,PF-SoftCap,PF-Window \
    --seqs 4096,16384 --providers neptune,sdpa-cudnn,flex --dtype $dt --no-plots \
    --out "/tmp/prefill-$dt" > "$OUT/prefill-$dt-log.txt" 2>&1; echo "rc $?"
  cp "/tmp/prefill-$dt/report.md" "$OUT/prefill-$dt-report.md"
  cp "/tmp/prefill-$dt/results.json" "$OUT/prefill-$dt.json"
  grep -E "^\| PF-[A-Za-z]+ \| [0-9]+ \| [0-9.]+ \|" "$OUT/prefill-$dt-report.md" | head -12
done
date -u
