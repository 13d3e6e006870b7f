"""The inference runtime: one continuous-batching engine over llama.cpp,
shared by `chat`, `run` and `serve`."""
