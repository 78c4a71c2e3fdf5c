"""LLM clients: the small `LLMClient` protocol that judges and simulators call (no HTTP client yet)."""

from k2post.llm.client import LLMClient, load_client_factory

__all__ = ["LLMClient", "load_client_factory"]
