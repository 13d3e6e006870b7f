# Included right after llama.cpp's own project() call (scripts/_setup.sh
# passes it as CMAKE_PROJECT_llama.cpp_INCLUDE). llama-cpp-python forces
# LLAMA_BUILD_COMMON on with a cache FORCE, which no -D can undo, yet its
# Python code loads only libllama and ggml: llama-common (the CLI tools'
# argument parser, chat parsers, Jinja engine and HTTP client) is compiled,
# installed outside the package, and never loaded. A normal variable shadows
# the forced cache entry, and llama.cpp's option() (policy CMP0077) keeps it.
set(LLAMA_BUILD_COMMON OFF)
