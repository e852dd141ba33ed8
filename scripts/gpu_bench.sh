#!/usr/bin/env bash
# GPU benchmark, run on the device machine by the `device` tool from the repository root, with the pack made by
# scripts/gpu_pack.sh carried along (`carry: [".gpu"]`):
#   bash scripts/gpu_bench.sh BUDGET_S        # e.g. 565: stop starting phases once BUDGET_S seconds have passed
# build (once, ~4 min on 16 cores): llama.cpp from .gpu/src.tar.xz with .gpu/cmake_args (CUDA, sm_90) and its
#   tools (llama-bench, llama-batched-bench, llama-server); the wheels of .gpu/wheels and llama-cpp-python's
#   Python package over that build into /tmp/site; the three test models, full size with random weights, from
#   the skeletons in .gpu/models (scripts/synth_gguf.py fill: speeds only, their text is garbage).
# Then each phase not yet done, if the time left is enough for it (a second call on the same warm machine resumes
# at the first phase not done; a fresh machine starts over):
#   sanity     localrun doctor, and a 32-token `localrun run` of SmolLM2 and Qwen 1.5B with --verbose: the GPU is
#              found and used, and the speeds it prints
#   tests      tests/engine/test_backend_sampling.py: backend sampling (the top-k in the device's graph) gives the
#              tokens sampling from raw logits gives
#   serve      scripts/bench_serve.py, the three models: localrun serve against llama-server side by side, TTFT
#              and aggregate t/s at 1, 8 and 16 concurrent streams, memory (serve.txt, serve.json)
#   runbench   localrun bench --compare llama-bench, pp512 / tg128 for the three models: localrun's own decode
#              against llama-bench's
#   serve_off  bench_serve.py for Gemma and Qwen with LOCALRUN_BACKEND_SAMPLING=off: what backend sampling gains
# $OUT gets at most 8 files (the device tool returns no more): progress.txt, sanity.txt, tests.txt, serve.txt,
# serve.json, runbench.txt, serve_off.txt, serve_off.json. A phase added here must stay within that.
set -uo pipefail
BUDGET_S="${1:-540}"
T0=$(date +%s)
REPO="$PWD"
W=/tmp/w
OUT="${OUT:-/tmp/out}"
mkdir -p "$W" "$OUT"
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/progress.txt"; }
done_() { touch "$W/done.$1"; }
is_done() { [ -e "$W/done.$1" ]; }

export PATH="/usr/local/cuda/bin:$W/build/bin:/tmp/bin:$PATH"
export PYTHONPATH="/tmp/site:$REPO/src:$REPO/tests"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export LOCALRUN_HOME=/tmp/lrhome LOCALRUN_LLAMA_BENCH_DIR="$W/build"
SMOL=/root/.cache/localrun-test-models/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA=/root/.cache/localrun-test-models/gemma-3-270m-q4_k_m.gguf
QWEN=/root/.cache/localrun-test-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

if ! is_done build; then
  log "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader) nvcc: $(nvcc --version | tail -1) cpus: $(nproc)"
  tar -xJf .gpu/src.tar.xz -C "$W" || { log "untar failed"; exit 1; }
  SRC="$(echo $W/llama_cpp_python-*)"
  if [ -x /opt/gcc/bin/g++ ]; then export CC=/opt/gcc/bin/gcc CXX=/opt/gcc/bin/g++ CUDAHOSTCXX=/opt/gcc/bin/g++; fi
  log "cmake (CXX=${CXX:-default})"
  cmake -S "$SRC/vendor/llama.cpp" -B "$W/build" -G Ninja $(cat .gpu/cmake_args) > "$W/cmake.log" 2>&1 || { log "cmake failed"; tail -30 "$W/cmake.log"; exit 1; }
  log "build"
  cmake --build "$W/build" -j "$(nproc)" --target llama ggml mtmd llama-bench llama-server llama-batched-bench > "$W/build.log" 2>&1 || { log "build failed"; grep -m5 -B2 -A8 "error" "$W/build.log"; tail -20 "$W/build.log"; exit 1; }
  log "built"
  mkdir -p /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/wheels/*.whl > "$W/pip.log" 2>&1 || { log "pip failed"; tail "$W/pip.log"; exit 1; }
  cp -r "$SRC/llama_cpp" /tmp/site/ && mkdir -p /tmp/site/llama_cpp/lib && cp -a "$W"/build/bin/*.so* /tmp/site/llama_cpp/lib/
  VER="${SRC##*-}"; D=/tmp/site/llama_cpp_python-$VER.dist-info; mkdir -p $D
  printf 'Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: %s\n' "$VER" > $D/METADATA; : > $D/RECORD
  mkdir -p /tmp/bin
  printf '#!/bin/sh\nexec python3 -c "import sys; from localrun.cli import main; sys.argv[0] = \\"localrun\\"; sys.exit(main())" "$@"\n' > /tmp/bin/localrun
  chmod +x /tmp/bin/localrun
  mkdir -p /root/.cache/localrun-test-models
  python3 scripts/synth_gguf.py fill .gpu/models/smollm2 "$SMOL" && python3 scripts/synth_gguf.py fill .gpu/models/gemma3 "$GEMMA" \
    && python3 scripts/synth_gguf.py fill .gpu/models/qwen15 "$QWEN" || { log "synth failed"; exit 1; }
  log "installed; models made"
  done_ build
fi

phase() {  # phase NAME NEEDS_S COMMAND...: run unless done or too little time is left
  local name="$1" need="$2"; shift 2
  is_done "$name" && return 0
  if [ "$(left)" -lt "$need" ]; then log "skip $name (left $(left)s < $need s)"; return 0; fi
  log "phase $name"
  timeout "$(left)" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  log "phase $name rc=$rc"; tail -25 "$OUT/$name.txt"
  [ $rc = 0 ] && done_ "$name"
  return 0
}

phase sanity 40 bash -c "localrun doctor; localrun run '$SMOL' 'Hello' -n 32 --keep-alive 0 --verbose; localrun run '$QWEN' 'def f' -n 32 --keep-alive 0 --verbose"
# llama_cpp first: on that image pytest's plugins import numpy, and with numpy loaded first the CUDA build's
# tokenizer segfaults in std::regex when a model loads (see commit 2070fd5).
phase tests 60 python3 -c "import llama_cpp.llama_cpp, sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/engine/test_backend_sampling.py']))"
phase serve 200 python3 scripts/bench_serve.py --model "$SMOL" --model "$GEMMA" --model "$QWEN" --reps 3 --threads 4 --json "$OUT/serve.json"
phase runbench 150 localrun bench "$SMOL" "$GEMMA" "$QWEN" --compare llama-bench --pp 512 --tg 128 --reps 5 -t 4 -o md
phase serve_off 120 env LOCALRUN_BACKEND_SAMPLING=off python3 scripts/bench_serve.py --model "$GEMMA" --model "$QWEN" --reps 3 --threads 4 --json "$OUT/serve_off.json"
log "end; left $(left)s"
n=$(find "$OUT" -type f | wc -l); [ "$n" -le 8 ] || log "warning: $n files under \$OUT, the device tool returns 8"
ls "$W"/done.* | xargs -n1 basename
