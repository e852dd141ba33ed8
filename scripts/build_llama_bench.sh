#!/usr/bin/env bash
# Build llama.cpp's own llama-bench (and llama-perplexity, llama-batched-bench, llama-server) from the llama.cpp
# source that the pinned llama-cpp-python vendors, with the same CPU flags as scripts/build_llama_cpp.sh cpu, so
# the comparisons in `scripts/bench_decode.py`, `scripts/bench_serve.py` and `localrun bench --compare
# llama-bench` are like for like. llama-server is built without its web UI (nothing to download).
#
#   scripts/build_llama_bench.sh            # -> ~/.cache/localrun/llama-bench-<version>/bin/llama-bench
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION="$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$HERE/../pyproject.toml")"
OUT="${LOCALRUN_LLAMA_BENCH_DIR:-$HOME/.cache/localrun/llama-bench-$VERSION}"
[ -x "$OUT/bin/llama-bench" ] && [ -x "$OUT/bin/llama-batched-bench" ] && [ -x "$OUT/bin/llama-server" ] && { echo "$OUT/bin/llama-bench"; exit 0; }
PY="${PYTHON:-python3}"
SRC="$(mktemp -d)"
trap 'rm -rf "$SRC"' EXIT
"$PY" -m pip download --quiet --no-deps --no-binary :all: -d "$SRC" "llama-cpp-python==$VERSION" >&2
tar -xzf "$SRC"/llama_cpp_python-*.tar.gz -C "$SRC"
LLAMA="$(echo "$SRC"/llama_cpp_python-*/vendor/llama.cpp)"
# Same CPU flags as the wheel (see build_llama_cpp.sh).
FLAGS="$(bash "$HERE/build_llama_cpp.sh" --print-cmake-args cpu)"
# shellcheck disable=SC2086
cmake -S "$LLAMA" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  $(echo "$FLAGS" | sed 's/-DLLAMA_BUILD_TOOLS=OFF//') >&2
cmake --build "$SRC/build" --config Release -j "$(nproc)" --target llama-bench llama-perplexity llama-batched-bench llama-server >&2
mkdir -p "$OUT/bin"
cp "$SRC/build/bin/llama-bench" "$SRC/build/bin/llama-perplexity" "$SRC/build/bin/llama-batched-bench" "$SRC/build/bin/llama-server" "$OUT/bin/"
echo "$OUT/bin/llama-bench"
