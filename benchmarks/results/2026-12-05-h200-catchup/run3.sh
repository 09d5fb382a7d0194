#!/bin/bash
export PYTHONUNBUFFERED=1
date -u
echo "== bn_probe"; (cd benchmarks && NEPTUNE_FUSION_CACHE_DIR=/tmp/bp PYTHONPATH=../src:. timeout 200 python bn_probe.py --out $OUT/bn_probe.jsonl 2>&1 | grep -v Warning | tail -30)
for snap in after before; do
  if [ $snap = before ]; then src=$PWD/.gpu/c1/src; else src=$PWD/src; fi
  echo "== jit_modules $snap"; date -u
  (cd benchmarks && NEPTUNE_FUSION_CACHE_DIR=/tmp/jd-$snap PYTHONPATH=$src:. timeout 100 python jit_modules.py --work batch-norm-stats,instance-norm --out $OUT/jit_modules3-$snap.jsonl 2>&1 | grep "^|")
done
date -u
