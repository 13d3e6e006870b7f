"""llmctl: run open-weight LLMs on your own machine."""

__version__ = "0.1.0"
