"""eLLM: ask questions about whole documents with a local LLM on the CPU."""

__version__ = "0.1.0"
