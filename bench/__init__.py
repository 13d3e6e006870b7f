"""`llmctl bench`: load-test any OpenAI-compatible server the way Modal's
LLM Almanac does (maximum throughput, serial latency, a concurrency sweep)."""

from llmctl.bench.api import bench, compare

__all__ = ["bench", "compare"]
