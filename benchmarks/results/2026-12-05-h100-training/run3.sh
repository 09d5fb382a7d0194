#!/bin/bash
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
NEPTUNE_FUSION_CACHE_DIR=/tmp/p3 PYTHONPATH=src timeout 150 python .gpu/probe3.py "$OUT" 2>&1 | grep -v "^[┏┃┡│└]" | tail -30
