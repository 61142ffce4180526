#!/usr/bin/env bash
# Session 12, after the fix of gc.get_freeze_count in live stats: plain decoding over HTTP (1 and
# 4 HTTP workers) against in-process at c=64, on random SmolLM2 weights (no model upload: the
# config and tokenizer of .gpu6/smolcfg), from the carried working tree, on a machine whose wheels
# were installed by benchmarks/gpu_session6.sh install (.whlA, .out/http-wheels, .whlB, .whlC).
#   bash benchmarks/gpu12/http_check.sh        (device; writes $OUT/http_check/)
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer-ws SGLAUNCH_CACHE_DIR=/tmp/cache
O=$OUT/http_check && mkdir -p "$O" /tmp/rw
python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
import profile_step as ps
print(ps.random_like(Path('.gpu6/smolcfg'), Path('/tmp/rw')))" > "$O/random.log" 2>&1 || { cat "$O/random.log"; exit 1; }
M=/tmp/rw/target
timeout 200 python3 benchmarks/http_vs_inprocess.py --device cuda --model $M --concurrency 64 --new-tokens 128 \
  --requests 1024 --repeats 1 --sides http,in-process --tokenizer-worker-num 4 --out "$O/http4.json" > "$O/http4.log" 2>&1
tail -n 8 "$O/http4.log"
timeout 120 python3 benchmarks/http_vs_inprocess.py --device cuda --model $M --concurrency 64 --new-tokens 128 \
  --requests 1024 --repeats 1 --sides http,in-process --out "$O/http1.json" > "$O/http1.log" 2>&1
tail -n 8 "$O/http1.log"
