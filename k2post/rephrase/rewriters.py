"""Who rewrites a chunk: the `Rewriter` seam of the rephraser, with an LLM implementation (any `LLMClient`: the
HTTP client of a `k2post serve` endpoint, or an in-process `EngineLLMClient`) and the offline builtin one that
re-renders the synthetic corpus's sentences in other templates and orders.

    rewriter = LLMRewriter(HTTPLLMClient(cfg.llm), temperature=0.7, max_tokens=512, context_chars=2000)
    text = rewriter.rewrite(chunk, previous=["rewritten chunk 0"], style="As a news report.", rewrite_index=1,
                            salt="doc-7")
    BuiltinRewriter().rewrite("Kalo was born in 1931.", [], "", rewrite_index=2, salt="Kalo")
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from k2post.command import UserError
from k2post.rephrase.chunking import split_sentences
from k2post.rephrase.corpus import parse_fact, render_facts
from k2post.rephrase.prompts import rewrite_messages, strip_thinking


class RephraseError(UserError, RuntimeError):
    """The run cannot go on: a bad input row, text the backend cannot rewrite, an out_dir of another run."""


class UnrewritableText(RephraseError):
    """The backend cannot rewrite this text at all (not a failed attempt: retrying would not help)."""

    def __init__(self, why: str, text: str):
        self.why, self.text = why, text
        super().__init__(f"{why}: {shorten(text)!r}")

    def located(self, doc_id: str, chunk: int) -> RephraseError:
        """The same error naming the document and chunk it happened in."""
        return RephraseError(f"{self.why}; doc {doc_id} chunk {chunk}: {shorten(self.text)!r}")


def shorten(text: str, limit: int = 80) -> str:
    """`text` on one line, cut to `limit` characters with "..."."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@runtime_checkable
class Rewriter(Protocol):
    """Rewrites one chunk of a document in a style, after the already rewritten chunks `previous`."""

    def rewrite(self, chunk: str, previous: list[str], style: str, rewrite_index: int, salt: str) -> str:
        """The rewritten chunk. `rewrite_index` (>= 1) and `salt` (the document and chunk) tell rewrites apart."""
        ...


class LLMRewriter:
    """Rewrites through an `LLMClient`: a system prompt, then the style, the last `context_chars` characters of
    the rewritten text so far and the passage; the reply after any `</think>`, stripped. An empty reply raises
    ValueError (the pipeline counts it as a failed attempt, like any client error)."""

    def __init__(self, client: Any, temperature: float = 0.7, max_tokens: int = 512, context_chars: int = 2000):
        self.client, self.temperature, self.max_tokens = client, temperature, max_tokens
        self.context_chars = context_chars

    def rewrite(self, chunk: str, previous: list[str], style: str, rewrite_index: int, salt: str) -> str:
        messages = rewrite_messages(chunk, previous, style, self.context_chars)
        reply = self.client.chat(messages, temperature=self.temperature, max_tokens=self.max_tokens)
        text = strip_thinking(reply if isinstance(reply, str) else "")
        if not text:
            raise ValueError(f"empty rewrite (reply {shorten(str(reply))!r})")
        return text


class BuiltinRewriter:
    """The synthetic corpus's own rephraser: each sentence of the chunk parsed back into its fact
    (`corpus.parse_fact`), the facts rendered again as rewrite `rewrite_index` seeded by `salt`
    (`corpus.render_facts`: a template per fact and an order of their own). Offline and always faithful; the
    style is not used. A sentence that is not a corpus sentence raises `UnrewritableText`."""

    def rewrite(self, chunk: str, previous: list[str], style: str, rewrite_index: int, salt: str) -> str:
        facts = []
        for sentence in split_sentences(chunk):
            fact = parse_fact(sentence)
            if fact is None:
                raise UnrewritableText("builtin backend rewrites only the synthetic corpus's sentences", sentence)
            facts.append(fact)
        return render_facts(facts, rewrite_index, salt)
