# Included right after llama.cpp's own project() call (scripts/_setup.sh
# passes it as CMAKE_PROJECT_llama.cpp_INCLUDE). llama-cpp-python forces
# LLAMA_BUILD_COMMON on with a cache FORCE, which no -D can undo, yet its
# Python code loads only libllama and ggml: llama-common (the CLI tools'
# argument parser, chat parsers, Jinja engine and HTTP client) is compiled,
# installed outside the package, and never loaded. A normal variable shadows
# the forced cache entry, and llama.cpp's option() (policy CMP0077) keeps it.
set(LLAMA_BUILD_COMMON OFF)

# Batch invariance (docs/exactness.md): with two or more threads, ggml's CPU
# flash attention gives a lone decode row over 512+ KV cells a split-KV
# kernel, which sums the softmax in per-thread pieces, while the same row
# beside other rows takes the per-row kernel. So a greedy answer could
# depend on what else the server ran in its step. llmctl turns the split
# path off; the per-row kernel already spreads a step's heads over the
# threads, which on a few cores costs nothing measurable (measurements.md,
# "Flash attention"). The build stops if the line is not found, so a new
# llama.cpp cannot drop the guarantee silently.
set(_llmctl_fa "${CMAKE_CURRENT_SOURCE_DIR}/ggml/src/ggml-cpu/ops.cpp")
file(READ "${_llmctl_fa}" _llmctl_src)
set(_llmctl_old "q->type == GGML_TYPE_F32 && nek1 >= 512;")
set(_llmctl_new "q->type == GGML_TYPE_F32 && nek1 >= 512 && false /* llmctl: batch-invariant */;")
string(FIND "${_llmctl_src}" "${_llmctl_new}" _llmctl_done)
if(_llmctl_done EQUAL -1)
  string(FIND "${_llmctl_src}" "${_llmctl_old}" _llmctl_at)
  if(_llmctl_at EQUAL -1)
    message(FATAL_ERROR "llmctl: flash attention's split-KV condition not found in ${_llmctl_fa}")
  endif()
  string(REPLACE "${_llmctl_old}" "${_llmctl_new}" _llmctl_src "${_llmctl_src}")
  file(WRITE "${_llmctl_fa}" "${_llmctl_src}")
endif()
