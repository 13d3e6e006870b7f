#!/usr/bin/env bash
# Prepare .gpu/ (ignored by git), what scripts/gpu_check.sh needs on a GPU
# machine that reaches no package index: the wheels llmctl needs beyond
# that machine's image, llama-cpp-python's Python package (no library: the
# check builds llama.cpp itself), the llama.cpp of the pinned sdist trimmed
# to what a CUDA build of libllama, llama-server and llama-bench reads
# (about 4 MB), and the random-weight model writer. Run here, once.
#   ./scripts/gpu_pack.sh [PATH/make_gguf.py]    # default ../shared/gpu/make_gguf.py
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$REPO/.gpu"
VENV="${LLMCTL_VENV:-$REPO/.venv}"
VERSION="$(sed -n 's/^LLAMA_CPP_VERSION="\(.*\)"/\1/p' "$REPO/scripts/_setup.sh")"
WRITER="${1:-$REPO/../shared/gpu/make_gguf.py}"
# The image has typer, rich, httpx, anyio, jinja2, numpy, psutil and the
# build tools (/work/.library/device/KINDS.md); these it lacks, pinned to
# versions whose requirements agree (Python 3.12, manylinux x86-64).
WHEELS=(fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5
        annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
        opentelemetry-api==1.45.2 uvicorn==0.55.0 gguf==0.19.0 diskcache==5.6.3)

rm -rf "$PACK" && mkdir -p "$PACK/whl"
cp "$WRITER" "$PACK/make_gguf.py"
"$VENV/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$PACK/whl" "${WHEELS[@]}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$VERSION"
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src="$(ls -d "$work"/llama_cpp_python-*/)"
# The Python package alone (LLAMA_BUILD=OFF compiles nothing); its
# metadata is what `llmctl info` reads the version from.
"$VENV/bin/pip" wheel -q --no-deps -w "$PACK/whl" -C cmake.define.LLAMA_BUILD=OFF \
  -C cmake.define.LLAVA_BUILD=OFF "$src"
# llama.cpp without its models, docs, tests, examples, web UI sources and
# the backends a CUDA build never configures.
cpp="$src/vendor/llama.cpp"
rm -rf "$cpp"/{models,docs,tests,examples,pocs,benches,gguf-py,media,.github,conversion}
rm -rf "$cpp"/tools/ui/{src,tests,static,package-lock.json} "$cpp"/tools/server/{tests,bench}
for backend in opencl sycl vulkan hexagon metal webgpu openvino cann virtgpu zdnn zendnn; do
  rm -rf "$cpp/ggml/src/ggml-$backend"
done
find "$cpp" -name '*.md' -delete
tar -czf "$PACK/llama_trim.tar.gz" -C "$(dirname "$cpp")" llama.cpp
du -sh "$PACK" "$PACK/llama_trim.tar.gz" "$PACK/whl"
