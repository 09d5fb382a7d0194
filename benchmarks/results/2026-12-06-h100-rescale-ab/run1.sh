# A/B in one process (gluon_generated --edits): the column split undone, and the lazy
# rescale (lagging maximum + warpgroup vote) on PF-Causal, PF-ALiBi, PF-Global
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
date -u >> $OUT/gpu.txt
NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-gg PYTHONPATH=src:benchmarks timeout 360 python benchmarks/gluon_generated.py \
  --ops PF-ALiBi,PF-Causal --seqs 16384,4096 --tiles 128x128x2 \
  --edits none,unsplit-cols,lazy-rescale --flex --budget 300 --out $OUT > $OUT/log.txt 2>&1
echo "rc $?"; date -u
grep -c '"ok": true' $OUT/gluon_generated.jsonl
