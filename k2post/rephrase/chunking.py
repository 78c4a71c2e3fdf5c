"""Split documents into chunks of at most N tokens whose boundaries fall at sentence ends (issue 21's rephraser
rewrites chunk by chunk, each conditioned on the rewritten chunks before it).

    chunks = chunk_document(text, count_tokens=lambda s: len(tokenizer.encode(s)), max_tokens=256)
"""

from __future__ import annotations

import re
from collections.abc import Callable

_SENTENCE_END = re.compile(r"([.!?][\"')\]]*)\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`: a cut after . ! ? (with any closing quotes or brackets) followed by whitespace and an
    upper-case letter or a digit. Whitespace inside a sentence is kept; empty pieces are dropped."""
    text, out, start = text.strip(), [], 0
    for match in _SENTENCE_END.finditer(text):
        out.append(text[start : match.end(1)])
        start = match.end()
    out.append(text[start:])
    return [piece.strip() for piece in out if piece.strip()]


def chunk_document(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[str]:
    """Consecutive sentences packed greedily into chunks of at most `max_tokens` (a sentence longer than that is a
    chunk of its own: never cut mid-sentence). Joined with single spaces."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    chunks: list[list[str]] = []
    used = 0
    for sentence in split_sentences(text):
        size = count_tokens(sentence)
        if chunks and used + size <= max_tokens:
            chunks[-1].append(sentence)
            used += size
        else:
            chunks.append([sentence])
            used = size
    return [" ".join(chunk) for chunk in chunks]
