"""The prompt-prefix KV cache, in memory and on disk."""
