#!/usr/bin/env bash
# Build the GPU benchmark pack: everything scripts/gpu_bench.sh needs on the device machine, which reaches
# nothing outside itself and is sent at most 64 MiB. The pack (~22 MB) is
#   src.tar.xz  the pinned llama-cpp-python sdist, trimmed to what a CUDA build of llama.cpp's library,
#               llama-bench, llama-batched-bench, llama-perplexity and llama-server needs (~2.8 MB; 76 MB whole)
#   cmake_args  the CMake flags of that build (CUDA, sm_90)
#   wheels/     py3.12 manylinux wheels of the Python packages the device image lacks (~5 MB)
#   models/     skeletons of the three test models (header + tensor layout, ~14 MB), made into full-size
#               models with random weights there by scripts/synth_gguf.py fill (the real ones are 1.4 GB)
# It goes to the device machine with `carry: [".gpu"]` (a git-ignored folder: this script adds /.gpu/ to
# .git/info/exclude if it is missing), and is run there from the repository root with
#   bash scripts/gpu_bench.sh 565
# The first call builds in ~4 min on 16 cores, then benchmarks; a second call on the same warm machine resumes
# at the first phase not done.
#
#   scripts/gpu_pack.sh [DIR]        # DIR defaults to .gpu in the repository root
# Inputs: the llama-cpp-python sdist (pip download of the version pinned in pyproject.toml, or
# LLAMA_CPP_PYTHON_SRC=an sdist tarball or unpacked tree), pip download of the wheels (the versions installed
# in .venv where it has them), and the test models in ${LOCALRUN_TEST_MODELS:-~/.cache/localrun-test-models}.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
DEST="${1:-$ROOT/.gpu}"
VERSION="$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$ROOT/pyproject.toml")"
MODELS="${LOCALRUN_TEST_MODELS:-$HOME/.cache/localrun-test-models}"
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi

# The Python packages scripts/gpu_bench.sh installs there (the device image has numpy, rich, click, httpx, ...),
# with the versions used when this was written; a version installed in .venv replaces its default.
WHEELS="annotated-doc==0.0.7 annotated-types==0.8.0 diskcache==5.6.3 gguf==0.19.0 httptools==0.9.0
prompt-toolkit==3.0.53 pydantic==2.14.4 pydantic-core==2.50.5 shellingham==1.5.4 starlette==1.10.0
typer==0.28.0 typing-extensions==4.16.0 typing-inspection==0.4.5 uvicorn==0.54.0 wcwidth==0.9.4"

# Test model file -> skeleton name (scripts/gpu_bench.sh makes the models back under these file names).
SKELETONS="smollm2:SmolLM2-135M-Instruct.Q4_1.gguf gemma3:gemma-3-270m-q4_k_m.gguf
qwen15:qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"

# CUDA build for the H100/H200 (sm_90); CPU flags as the wheels' AVX2 build; tools on, web UI and the rest off.
CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_RPC=ON -DLLAMA_OPENSSL=OFF \
-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON \
-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF"

for m in $SKELETONS; do
  [ -f "$MODELS/${m#*:}" ] || { echo "missing test model $MODELS/${m#*:}" >&2; exit 1; }
done
if [ -e "$DEST" ] && [ -n "$(ls -A "$DEST")" ] && [ ! -e "$DEST/src.tar.xz" ] && [ ! -e "$DEST/cmake_args" ]; then
  echo "$DEST exists and is not a pack: not replacing it" >&2; exit 1
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PACK="$TMP/pack"
mkdir -p "$PACK/wheels" "$PACK/models" "$TMP/sdist"

# --- the llama-cpp-python source
SRC_IN="${LLAMA_CPP_PYTHON_SRC:-}"
if [ -z "$SRC_IN" ]; then
  "$PY" -m pip download --quiet --no-deps --no-binary :all: -d "$TMP/dl" "llama-cpp-python==$VERSION" >&2
  SRC_IN="$(echo "$TMP"/dl/llama_cpp_python-*.tar.gz)"
fi
if [ -d "$SRC_IN" ]; then
  NAME="$(basename "$SRC_IN")"
  [ "$NAME" = "llama_cpp_python-$VERSION" ] || NAME="llama_cpp_python-$VERSION"
  cp -a "$SRC_IN" "$TMP/sdist/$NAME"
else
  tar -xzf "$SRC_IN" -C "$TMP/sdist"
fi
S="$(echo "$TMP"/sdist/llama_cpp_python-*)"
[ -d "$S/vendor/llama.cpp/ggml" ] || { echo "no vendor/llama.cpp in $SRC_IN" >&2; exit 1; }
L="$S/vendor/llama.cpp"

# --- trimming: what the build of scripts/gpu_bench.sh never reads
( cd "$S" && rm -rf .git .github docker docs examples scripts tests )
( cd "$L" && rm -rf .devops .gemini .github .pi benches ci conversion docs examples gguf-py grammars media models \
    pocs requirements skills tests )
# vendor/llama.cpp/.git (a `gitdir:` line into the sdist's .git, removed above) stays, as in the pack the
# H200 run built from.
find "$L/scripts" -mindepth 1 -maxdepth 1 ! -name ui-assets.cmake -exec rm -rf {} +
( cd "$L/ggml/src" && rm -rf ggml-blas ggml-cann ggml-et ggml-hexagon ggml-hip ggml-metal ggml-musa ggml-opencl \
    ggml-openvino ggml-sycl ggml-virtgpu ggml-vulkan ggml-webgpu ggml-zdnn ggml-zendnn )
find "$L/tools" -mindepth 1 -maxdepth 1 ! -name CMakeLists.txt ! -name batched-bench ! -name llama-bench \
  ! -name mtmd ! -name perplexity ! -name server ! -name ui -exec rm -rf {} +
( cd "$L/tools/mtmd" && rm -rf legacy-models test-1.jpeg test-2.mp3 test-3.mp4 tests tests.sh )
( cd "$L/tools/server" && rm -rf bench tests )
( cd "$L/tools/ui" && rm -rf package-lock.json src static tests )
sed -i \
  -e 's/^# tools$/# tools (trimmed copy: only batched-bench, llama-bench, perplexity, server (+ui), mtmd)/' \
  -e '/add_subdirectory(\(gguf-split\|imatrix\|completion\|quantize\|cli\|tokenize\|tts\|fit-params\|results\))/d' \
  -e '/if (GGML_RPC)/,/endif()/d' \
  -e '/if (NOT GGML_BACKEND_DL AND GGML_CPU)/,/endif()/d' \
  -e '/if (GGML_METAL)/,/endif()/d' \
  "$L/tools/CMakeLists.txt"
# Every tool still named must be there (a newer llama.cpp may name others).
for d in $(sed -n 's/.*add_subdirectory(\([^)]*\)).*/\1/p' "$L/tools/CMakeLists.txt"); do
  [ -d "$L/tools/$d" ] || { echo "tools/CMakeLists.txt still names tools/$d, which was removed" >&2; exit 1; }
done
tar -cJf "$PACK/src.tar.xz" -C "$TMP/sdist" --sort=name --owner=0 --group=0 --numeric-owner "$(basename "$S")"
echo "$CMAKE_ARGS" > "$PACK/cmake_args"

# --- wheels (for the device image's CPython 3.12 on x86-64 Linux)
REQS=""
for w in $WHEELS; do
  name="${w%%==*}"
  v="$("$PY" -c 'import sys
from importlib.metadata import version
try: print(version(sys.argv[1]))
except Exception: pass' "$name" 2>/dev/null || true)"
  REQS="$REQS $name==${v:-${w#*==}}"
done
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --no-deps --only-binary :all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$PACK/wheels" $REQS >&2

# --- model skeletons
for m in $SKELETONS; do
  "$PY" "$HERE/synth_gguf.py" skeleton "$MODELS/${m#*:}" "$PACK/models/${m%%:*}"
done

# --- into place
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST"
mv "$PACK" "$DEST"
if EXCL="$(git -C "$ROOT" rev-parse --git-path info/exclude 2>/dev/null)"; then
  case "$EXCL" in /*) ;; *) EXCL="$ROOT/$EXCL" ;; esac
  mkdir -p "$(dirname "$EXCL")"
  grep -qxF '/.gpu/' "$EXCL" 2>/dev/null || echo '/.gpu/' >> "$EXCL"
fi
du -sh "$DEST"
