# one call: issue 17's B=1 32/32 paged point (after, before, after) and issue 18's
# PF-ALiBi against FlexAttention, before/after the column split (fp16), after (bf16)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
date -u >> $OUT/gpu.txt
serve() { # name src dtype
  echo "== serving $1 $3"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-$1 PYTHONPATH=$2 timeout 90 python -m neptune_fusion.bench \
    --suite serving --ops B1,32/32 --dtype "$3" --no-plots --out "/tmp/serving-$1" \
    > "/tmp/serving-$1.txt" 2>&1; echo "rc $?"
  f=$(find "/tmp/serving-$1" -name report.md | head -1); [ -n "$f" ] && cp "$f" "$OUT/serving-$1-report.md"
}
alibi() { # name src dtype providers
  echo "== alibi $1 $3"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-$1 PYTHONPATH=$2 timeout 100 python -m neptune_fusion.bench \
    --ops PF-ALiBi --seqs 4096,16384 --providers $4 --dtype $3 --no-plots \
    --out "/tmp/alibi-$1" > "/tmp/alibi-$1.txt" 2>&1; echo "rc $?"
  cp /tmp/alibi-$1/report.md $OUT/alibi-$1-report.md 2>/dev/null
  tail -2 /tmp/alibi-$1.txt
}
serve after-1 src float16
alibi after-fp16 src float16 neptune,flex
alibi before-fp16 .gpu/head/src float16 neptune,flex
serve before-1 .gpu/before/src float16
serve after-2 src float16
alibi after-bf16 src bfloat16 neptune,flex
date -u
