#!/usr/bin/env bash
# Build llama.cpp's llama-server, the baseline of the serving benchmarks,
# from the llama.cpp vendored in the pinned llama-cpp-python sdist and with
# the CPU flags our own wheel was built with, so both run the same kernels.
#   ./scripts/build_llama_server.sh [OUT_DIR]   # default /tmp/llama-server-build
# Needs ./scripts/test or ./scripts/llmctl to have run once (the wheel cache
# records the flags). Takes several minutes on 2 cores; done once per machine.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-/tmp/llama-server-build}"
VERSION="$(sed -n 's/^LLAMA_CPP_VERSION="\(.*\)"/\1/p' "$REPO/scripts/_setup.sh")"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/llmctl/wheels"

if [[ -x "$OUT/bin/llama-server" ]]; then
  echo "$OUT/bin/llama-server already built"
  exit 0
fi
flags_file="$(ls -d "$CACHE"/llama_cpp_python-"$VERSION"-*/CMAKE_ARGS 2>/dev/null | head -n1 || true)"
if [[ -z "$flags_file" ]]; then
  echo "no llama-cpp-python $VERSION wheel in $CACHE: run ./scripts/test first" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$REPO/.venv/bin/pip" download --no-deps --no-binary :all: -d "$work" \
  "llama-cpp-python==$VERSION" >/dev/null
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src="$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)"
# The CPU flags only: the wheel's slimming include turns off llama-common,
# which llama-server needs.
cpu_flags="$(tr ' ' '\n' <"$flags_file" | grep -v '^-DCMAKE_PROJECT_' | tr '\n' ' ')"
# shellcheck disable=SC2086
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DBUILD_SHARED_LIBS=OFF $cpu_flags >/dev/null
cmake --build "$work/build" --target llama-server -j "$(nproc)" >/dev/null
mkdir -p "$OUT/bin"
cp "$work"/build/bin/llama-server "$OUT/bin/"
echo "built $OUT/bin/llama-server"
