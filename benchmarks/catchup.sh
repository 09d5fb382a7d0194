#!/bin/bash
# Device calls that measure what landed without a GPU (docs/results.md, "Still waiting
# for a device"). Usage on the device, from the repository root, with the "before" tree
# unpacked beside it (`.gpu/` is ignored by git; carry it):
#
#     git archive 99c2943 src | tar -x -C .gpu/before     # on this machine, first
#     OUT=/some/dir bash benchmarks/catchup.sh .gpu/before/src first
#     OUT=/some/dir bash benchmarks/catchup.sh .gpu/before/src second
#     OUT=/some/dir bash benchmarks/catchup.sh - training
#     OUT=/some/dir bash benchmarks/catchup.sh - next
#     OUT=/some/dir bash benchmarks/catchup.sh - bloom
#     git archive 6bfa524 src | tar -x -C .gpu/before     # the tree before the paged change
#     OUT=/some/dir bash benchmarks/catchup.sh .gpu/before/src paged
#     OUT=/some/dir bash benchmarks/catchup.sh - prefill
#     git archive 678fd8a src | tar -x -C .gpu/head       # the tree before the column split
#     OUT=/some/dir bash benchmarks/catchup.sh .gpu/head/src column
#     OUT=/some/dir bash benchmarks/catchup.sh - mma-bias
#     OUT=/some/dir bash benchmarks/catchup.sh - mma-emit
#     OUT=/some/dir bash benchmarks/catchup.sh - roofline
#
# first (about 6 minutes): gpu.txt; GPT-2 training steps against Inductor; the bf16
# chain reports A/B. second (about 6 minutes): the fp32 A/B, the jit modules, training
# steps of some chains. training (about 6 minutes; no "before" tree): the chain suite's
# training steps after c75855c (the keepdim-statistics epilogue: softmax, log-softmax,
# LayerNorm -> matmul ran at 0.16-0.31x Inductor before it), one group of chains per
# process so a slow one costs only its group, the backend's log kept; then a profile
# of softmax and LayerNorm -> matmul (benchmarks/jit_training_profile.py) and GPT-2's
# training step. next (about 5 minutes; no "before" tree; measured 2026-12-05 evening
# only on CPU): GPT-2's step with each provider's memory by op (its peak is 3 % above
# Inductor's, not explained), the chain suite's bf16 variance and layer statistics
# through the backend after the single-load fix (9411019), and the four prefill
# operators never timed through the backend in GPU time at 4096. bloom (about 5 minutes;
# landed 2026-12-05 evening, CPU-tested): a 4-layer Bloom training step with its
# attention made nf.attention's op (dynamo/alibi_attention.py) against Inductor, and the
# three Gluon GPU tests the H100 call of that evening did not reach (the ragged batch's
# walks with the snake deal, views, a prepared call). paged (about 6 minutes; landed
# 2026-12-05 late, CPU-tested, counted on sm_90 SASS): the serving suite's B = 1 points
# (fp16; the bf16 ones after) before and after 5763d20 (page ids clamped in 32 bits, a
# dense pool's strides as constants), alternating, twice each, one process per run.
# prefill (about 5 minutes; no "before" tree): issue 18's operators through
# `neptune-fusion bench` with the interleaved rounds of f5c6519 (each provider timed in 3
# rounds, the order turned each round), fp16 then bf16; then the bf16 chains that sat
# at 0.98x torch.compile, timed the same way. column (about 5 minutes; landed 2026-12-05
# night, CPU-tested, counted on sm_90 SASS): PF-ALiBi against FlexAttention before and
# after 878fba3 (ALiBi's column positions without a conversion per column: 657 -> 597
# instructions an interior tile), fp16, then after in bf16; the bench's float64 gate
# checks the new kernel. mma-bias (about 3 minutes; no "before" tree; written
# 2026-12-06, compiled for sm_90 on the CPU, never run): `gluon_generated.py --edits
# mma-bias`, ALiBi's column term added by one more 16-wide MMA step instead of per score
# (interior tile 597 -> 487 sm_90 instructions, PF-Causal 464), fp16 and bf16, beside the
# unedited kernel twice and PF-Causal, each checked against float64 (docs/hopper.md,
# "Where issue 18 stands (2026-12-06)"). mma-emit (about 4 minutes; no "before" tree):
# the emitter's column term through the MMA (codegen/mma_bias.py): the Gluon GPU tests
# of ALiBi and the column terms against float64, then PF-ALiBi and PF-Causal through
# `neptune-fusion bench`, fp16 then bf16, 5 rounds (an H100's power cap moved our
# kernels 5-18 % between rounds: 2026-12-06-h100-alibi-rounds). roofline (about 2 minutes; run on an H100 on
# 2026-12-06: benchmarks/results/2026-12-06-h100-b1-decode): benchmarks/paged_roofline.py,
# the best read bandwidth of a read-only kernel over the B = 1, 32-head cache contiguous,
# paged in order and paged through a shuffled table, with our decode and cuDNN beside it
# (issue 17's last point, docs/serving.md). Each part fits one call's 600 s.
set -u
before=${1:?give the src directory of the tree to compare against}
part=${2:?say which part: first, second, training, next, bloom, paged, prefill, column, mma-bias, mma-emit or roofline}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt"
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$OUT/gpu.txt"
date -u >> "$OUT/gpu.txt"
bench() { # name src extra-args...
  local name=$1 src=$2; shift 2
  echo "== $name"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-$name PYTHONPATH=$src timeout 150 python -m \
    neptune_fusion.bench --suite chains --providers neptune,torch-compile --timer graph \
    --no-plots --out "/tmp/$name" "$@" > "/tmp/$name.log" 2>&1; echo "rc $?"
  tail -3 "/tmp/$name.log"
  cp "$(find "/tmp/$name" -name report.md | head -1)" "$OUT/$name-report.md"
}
train() { # chains timeout
  echo "== jit_training $1"; date -u
  NEPTUNE_FUSION_LOG=1 NEPTUNE_FUSION_CACHE_DIR=/tmp/jt PYTHONPATH=src timeout "$2" python \
    benchmarks/jit_training.py --chains "$1" --dtypes bfloat16 --out "$OUT/jit_training.jsonl" \
    >> "$OUT/jit_training.log" 2>&1; echo "rc $?"
}
if [ "$part" = training ]; then
train softmax,log-softmax,layernorm-matmul 110
train variance,softmax-entropy,kl-divergence 110
train rmsnorm-matmul,layer-stats,cross-entropy 110
echo "== jit_training_profile"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/jp PYTHONPATH=src timeout 90 python \
  benchmarks/jit_training_profile.py --chains softmax,layernorm-matmul \
  > "$OUT/jit_training_profile.txt" 2>&1; echo "rc $?"
echo "== jit_gpt2_training model"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/jg PYTHONPATH=src timeout 130 python \
  benchmarks/jit_gpt2_training.py --work model --out "$OUT/jit_gpt2_training.jsonl" \
  2>&1 | grep '^{'
grep -h '^{' "$OUT/jit_training.log" | cut -c1-200
elif [ "$part" = next ]; then
echo "== jit_gpt2_training model --memory"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/jg PYTHONPATH=src timeout 200 python \
  benchmarks/jit_gpt2_training.py --work model --providers inductor,neptune_fusion --memory \
  --out "$OUT/jit_gpt2_training.jsonl" > "$OUT/jit_gpt2_memory.txt" 2>&1; echo "rc $?"
grep '^{' "$OUT/jit_gpt2_memory.txt" | cut -c1-300
bench chains-after src --dtype bfloat16 --ops variance,layer-stats,softmax --providers neptune,neptune-jit,torch-compile
echo "== attention 4096 through the backend"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/ja PYTHONPATH=src timeout 200 python -m neptune_fusion.bench \
  --ops PF-GQA,PF-ALiBi,PF-SoftCap,PF-Window --seqs 4096 --providers neptune,neptune-jit,torch-compile \
  --timer graph --no-plots --out /tmp/attn4096 > "$OUT/attention-4096-log.txt" 2>&1; echo "rc $?"
cp "$(find /tmp/attn4096 -name report.md | head -1)" "$OUT/attention-4096-report.md"
elif [ "$part" = paged ]; then
serve() { # name src dtype
  echo "== serving B1 $1 $3"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-$1 PYTHONPATH=$2 timeout 110 python -m neptune_fusion.bench \
    --suite serving --ops B1 --dtype "$3" --no-plots --out "/tmp/serving-$1" \
    > "$OUT/serving-$1.txt" 2>&1; echo "rc $?"
  cp "$(find "/tmp/serving-$1" -name report.md | head -1)" "$OUT/serving-$1-report.md"
  cp "$(find "/tmp/serving-$1" -name results.json | head -1)" "$OUT/serving-$1.json"
}
serve before-1 "$before" float16
serve after-1 src float16
serve before-2 "$before" float16
serve after-2 src float16
serve after-bf16 src bfloat16
elif [ "$part" = prefill ]; then
for dt in float16 bfloat16; do
  echo "== bench prefill $dt"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-prefill PYTHONPATH=src timeout 280 python -m \
    neptune_fusion.bench --ops PF-Global,PF-Causal,PF-GQA,PF-ALiBi,PF-SoftCap,PF-Window \
    --seqs 4096,16384 --providers neptune,sdpa-cudnn,flex --dtype $dt --no-plots \
    --out "/tmp/prefill-$dt" > "$OUT/prefill-$dt-log.txt" 2>&1; echo "rc $?"
  cp "/tmp/prefill-$dt/report.md" "$OUT/prefill-$dt-report.md"
  cp "/tmp/prefill-$dt/results.json" "$OUT/prefill-$dt.json"
done
bench chains-rounds src --dtype bfloat16 --ops variance,layer-stats,softmax --providers neptune,torch-compile
elif [ "$part" = column ]; then
alibi() { # name src dtype
  echo "== PF-ALiBi $1 $3"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-$1 PYTHONPATH=$2 timeout 140 python -m neptune_fusion.bench \
    --ops PF-ALiBi --seqs 4096,16384 --providers neptune,flex --dtype "$3" --no-plots \
    --out "/tmp/alibi-$1" > "/tmp/alibi-$1.log" 2>&1; echo "rc $?"
  tail -3 "/tmp/alibi-$1.log"
  cp "/tmp/alibi-$1/report.md" "$OUT/alibi-$1-report.md"
}
alibi after-fp16 src float16
alibi before-fp16 "$before" float16
alibi after-fp16-2 src float16
alibi after-bf16 src bfloat16
elif [ "$part" = mma-bias ]; then
for dt in float16 bfloat16; do
  echo "== gluon_generated mma-bias $dt"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-gg PYTHONPATH=src:benchmarks timeout 150 python \
    benchmarks/gluon_generated.py --ops PF-ALiBi,PF-Causal --seqs 16384,4096 \
    --tiles 128x128x2 --dtype $dt --edits none,mma-bias,none --flex --budget 120 \
    --out "$OUT" >> "$OUT/gluon_generated.log" 2>&1; echo "rc $?"
done
grep -h '"ms"' "$OUT/gluon_generated.jsonl" | cut -c1-300
elif [ "$part" = roofline ]; then
echo "== paged read roofline"; date -u
PYTHONPATH=src timeout 300 python benchmarks/paged_roofline.py --out "$OUT/paged_roofline.jsonl" \
  2>&1 | tail -8
elif [ "$part" = mma-emit ]; then
echo "== Gluon GPU tests: column terms through the MMA"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/jt PYTHONPATH=src:tests timeout 170 python -m pytest \
  -p no:cacheprovider tests/codegen/test_gluon.py -m gpu -k "column_terms or ALiBi" 2>&1 | tail -4
for dt in float16 bfloat16; do
  echo "== bench prefill ALiBi, Causal $dt"; date -u
  NEPTUNE_FUSION_CACHE_DIR=/tmp/cache-prefill PYTHONPATH=src timeout 190 python -m \
    neptune_fusion.bench --ops PF-ALiBi,PF-Causal --seqs 4096,16384 --rounds 5 \
    --providers neptune,sdpa-cudnn,flex --dtype $dt --no-plots \
    --out "/tmp/prefill-$dt" > "$OUT/prefill-$dt-log.txt" 2>&1; echo "rc $?"
  cp "/tmp/prefill-$dt/report.md" "$OUT/prefill-$dt-report.md"
  cp "/tmp/prefill-$dt/results.json" "$OUT/prefill-$dt.json"
  grep -E "PF-ALiBi|PF-Causal" "$OUT/prefill-$dt-report.md" | head -12
done
elif [ "$part" = bloom ]; then
echo "== jit_gpt2_training bloom"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/jb PYTHONPATH=src timeout 330 python \
  benchmarks/jit_gpt2_training.py --work bloom --providers inductor,neptune_fusion \
  --out "$OUT/jit_bloom_training.jsonl" 2>&1 | grep '^{' | cut -c1-300
echo "== Gluon GPU tests not reached"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/jt PYTHONPATH=src:tests timeout 200 python -m pytest \
  -p no:cacheprovider tests/codegen/test_gluon.py -m gpu -k "ragged or views" 2>&1 | tail -3
elif [ "$part" = first ]; then
echo "== jit_gpt2_training"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/jg PYTHONPATH=src timeout 280 python \
  benchmarks/jit_gpt2_training.py --out "$OUT/jit_gpt2_training.jsonl" 2>&1 | grep '^{'
bench bf16-before "$before" --dtype bfloat16 --ops softmax-entropy,kl-divergence,logsumexp
bench bf16-after src --dtype bfloat16 --ops softmax-entropy,kl-divergence,logsumexp
else
bench f32-before "$before" --dtype float32 --ops softmax-entropy,kl-divergence
bench f32-after src --dtype float32 --ops softmax-entropy,kl-divergence,variance,layer-stats
echo "== jit_modules"; date -u
(cd benchmarks && NEPTUNE_FUSION_CACHE_DIR=/tmp/jc PYTHONPATH=$PWD/../src:. timeout 150 \
  python jit_modules.py --work batch-norm-stats,group-norm,instance-norm,bloom-attention,pixel-cross-entropy,mish-log-softmax \
  --out "$OUT/jit_modules.jsonl" 2>&1 | tail -12)
echo "== jit_training"; date -u
NEPTUNE_FUSION_CACHE_DIR=/tmp/jt PYTHONPATH=src timeout 150 python benchmarks/jit_training.py \
  --chains softmax,log-softmax,softmax-entropy,kl-divergence,layernorm-matmul,rmsnorm-matmul \
  --dtypes bfloat16 --out "$OUT/jit_training.jsonl" 2>&1 | tail -20
fi
date -u
