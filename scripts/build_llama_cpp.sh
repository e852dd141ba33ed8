#!/usr/bin/env bash
# Build llama-cpp-python (the exact version localrun pins) for one backend and install it into a venv.
#
#   scripts/build_llama_cpp.sh cpu    [VENV]   # default: safe on any x86-64 CPU, see below
#   scripts/build_llama_cpp.sh cpu-exact [VENV] # cpu without llamafile's sgemm: results do not depend on
#                                              # batch shape (speculative decoding token-identical to plain
#                                              # decoding), at up to ~35% slower prefill on K-quants
#   scripts/build_llama_cpp.sh cuda   [VENV]   # NVIDIA: CUDA_ARCHS="90" (H100/H200), "89;86" ..., default "native"
#   scripts/build_llama_cpp.sh metal  [VENV]   # Apple silicon
#
# Why not plain `pip install llama-cpp-python`: its default build uses -march=native, and on AMX-capable
# x86 CPUs llama.cpp's AMX matmul path segfaults on the first decode. The cpu variant turns native
# detection off and enables AVX/AVX2/FMA/F16C/BMI2 explicitly, plus the AVX-512 family only where
# this CPU reports it (the wheel is built where it runs). AMX stays off.
#
# LLAMA_CPP_PYTHON_SRC=PATH builds from a local sdist or unpacked source tree instead of PyPI (machines
# without PyPI; pair it with PIP_NO_INDEX=1 PIP_FIND_LINKS=DIR holding the few runtime dependencies).
#
# Built wheels are kept in ~/.cache/localrun/wheels/<version>-<variant>-<flags hash>/, so a rebuild
# with the same flags is instant; pip's own wheel cache is bypassed because it ignores CMAKE_ARGS.
set -euo pipefail

PRINT_ONLY=0
if [ "${1:-}" = "--print-cmake-args" ]; then PRINT_ONLY=1; shift; fi
VARIANT="${1:-cpu}"
VENV="${2:-.venv}"
VERSION="$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$(dirname "$0")/../pyproject.toml")"
JOBS="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || sysctl -n hw.ncpu)}"

has_flag() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }

case "$VARIANT" in
  cpu|cpu-exact)
    ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    if [ "$(uname -m)" = "x86_64" ]; then
      if has_flag avx512f && has_flag avx512bw && has_flag avx512vl && has_flag avx512dq; then
        ARGS="$ARGS -DGGML_AVX512=ON"
        has_flag avx512vbmi && ARGS="$ARGS -DGGML_AVX512_VBMI=ON"
        has_flag avx512_vnni && ARGS="$ARGS -DGGML_AVX512_VNNI=ON"
        has_flag avx512_bf16 && ARGS="$ARGS -DGGML_AVX512_BF16=ON"
      fi
      has_flag avx_vnni && ARGS="$ARGS -DGGML_AVX_VNNI=ON"
      # Never enable GGML_AMX_*: that is the path that crashes.
    else
      ARGS="-DGGML_NATIVE=OFF"
    fi
    [ "$VARIANT" = cpu-exact ] && ARGS="$ARGS -DGGML_LLAMAFILE=OFF"
    ;;
  cuda)
    ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-native} -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    ;;
  metal)
    ARGS="-DGGML_METAL=on"
    ;;
  *)
    echo "usage: $0 cpu|cpu-exact|cuda|metal [VENV]" >&2
    exit 2
    ;;
esac
# GGML_RPC: `localrun worker` and --rpc (llama.cpp's RPC backend, libggml-rpc in the wheel).
ARGS="$ARGS -DGGML_RPC=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF ${EXTRA_CMAKE_ARGS:-}"

if [ "$PRINT_ONLY" = 1 ]; then echo "$ARGS"; exit 0; fi

HASH="$(printf '%s' "$ARGS" | sha256sum | cut -c1-12)"
WHEEL_DIR="${LOCALRUN_WHEEL_CACHE:-$HOME/.cache/localrun/wheels}/${VERSION}-${VARIANT}-${HASH}"
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no venv at $VENV: create it first (make venv)" >&2; exit 2; }

if ! ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $VERSION ($VARIANT): $ARGS" >&2
  echo "(about 4-5 minutes on 2 cores; cached afterwards in $WHEEL_DIR)" >&2
  TMP="$(mktemp -d)"
  CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
    "$PY" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$TMP" "${LLAMA_CPP_PYTHON_SRC:-llama-cpp-python==$VERSION}"
  mkdir -p "$WHEEL_DIR"
  mv "$TMP"/llama_cpp_python-*.whl "$WHEEL_DIR"/   # only a finished wheel lands in the cache
  printf '%s\n' "$ARGS" > "$WHEEL_DIR/CMAKE_ARGS"
  rm -rf "$TMP"
fi
"$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEEL_DIR"/llama_cpp_python-*.whl
"$PY" -m pip install --quiet "llama-cpp-python==$VERSION"  # its own dependencies (numpy, jinja2, ...)
echo "llama-cpp-python $VERSION ($VARIANT) installed in $VENV" >&2
