#!/bin/bash
# Device call 2: jit_modules A/B (HEAD c1 vs tree), attention A/B (a25c8fe a0 vs tree).
export PYTHONUNBUFFERED=1
for snap in before after; do
  if [ $snap = before ]; then src=$PWD/.gpu/c1/src; else src=$PWD/src; fi
  echo "== jit_modules $snap"; date -u
  (cd benchmarks && NEPTUNE_FUSION_CACHE_DIR=/tmp/jc-$snap PYTHONPATH=$src:. timeout 150 python jit_modules.py --work batch-norm-stats,group-norm,instance-norm --out $OUT/jit_modules-$snap.jsonl 2>&1 | tail -12)
done
for snap in before after; do
  if [ $snap = before ]; then src=.gpu/a0/src; else src=src; fi
  echo "== attention $snap"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/ac-$snap PYTHONPATH=$src timeout 200 python -m neptune_fusion.bench --ops PF-Global,PF-Causal,DC-Causal,DC-GQA --seqs 4096,16384 --providers sdpa-cudnn,neptune --timer graph --no-plots --out /tmp/att-$snap > /tmp/att-$snap.log 2>&1; echo "rc $?"
  tail -3 /tmp/att-$snap.log
  f=$(find /tmp/att-$snap -name report.md | head -1); cp $f $OUT/attention-$snap-report.md
done
date -u
echo "== nan_check"; sed -i 's/backend="neptune_fusion"/backend=__import__("neptune_fusion.dynamo", fromlist=["Backend"]).Backend()/' benchmarks/nan_check.py
PYTHONPATH=src timeout 150 python benchmarks/nan_check.py > $OUT/nan_check.jsonl 2>&1; echo "rc $?"; tail -2 $OUT/nan_check.jsonl
date -u
