"""LLM clients: the small `LLMClient` protocol, the OpenAI-compatible `HTTPLLMClient`, and
`k2post serve` (vLLM's api_server as a managed subprocess, in `k2post.llm.serve`)."""

from k2post.llm.client import ChatResult, LLMClient, LLMClientError, ToolLLMClient, load_client_factory
from k2post.llm.http_client import HTTPClientConfig, HTTPLLMClient

__all__ = [
    "ChatResult",
    "HTTPClientConfig",
    "HTTPLLMClient",
    "LLMClient",
    "LLMClientError",
    "ToolLLMClient",
    "load_client_factory",
]
