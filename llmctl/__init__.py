"""llmctl: run open-weight LLMs on your own machine."""

from llmctl import native

__version__ = "0.1.0"

# Before anything below imports numpy: a CUDA build of llama.cpp must be
# loaded first (llmctl/native.py says why).
native.install()
