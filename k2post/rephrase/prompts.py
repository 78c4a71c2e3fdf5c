"""The prompts of the rephraser's LLM calls: the chunk rewrite (style + the rewritten text so far + the passage)
and the faithfulness judge (source chunk + rewrite -> FAITHFUL / UNFAITHFUL).

    messages = rewrite_messages(chunk, previous=["The rewritten first chunk."], style="...", context_chars=2000)
    messages = judge_messages(source_chunk, rewritten_chunk)
    text = strip_thinking(reply)      # the part after a `</think>`, surrounding quotes and fences removed

The document, the rewrites and the style are untrusted text: each sits in an escaped block
(`k2post.chat.untrusted.block`), so a passage cannot close its block or carry chat structure.
"""

from __future__ import annotations

from k2post.chat.types import Message
from k2post.chat.untrusted import block

REWRITE_SYSTEM = (
    "You rewrite passages of a document in a given style. Keep every fact of the passage: every name, number, date "
    "and relation stays exactly as it is, and nothing is added that the passage does not say. Do not repeat the "
    "text rewritten so far; continue it. Write only the rewritten passage: no preface, no notes, no quotes."
)

REWRITE_USER = """Style:
{style}

{context}

Passage to rewrite:
{chunk}

Write only the rewritten passage."""

CONTEXT_START = "This passage is the start of the document."
CONTEXT_SO_FAR = "The document rewritten so far (continue it seamlessly, do not repeat it):\n{text}"

JUDGE_SYSTEM = "You check whether a rewrite of a source passage is faithful to it."

JUDGE_USER = """Source:
{source}

Rewrite:
{rewrite}

Is every statement of the rewrite supported by the source, and is every fact of the source kept unchanged \
(names, numbers, dates, relations)? Answer FAITHFUL or UNFAITHFUL, then one sentence why."""


def context_text(previous: list[str], context_chars: int) -> str:
    """The last `context_chars` characters of the rewritten chunks (joined by spaces), cut at a word boundary and
    marked with "..." when cut; "" when there is nothing (or context_chars is 0)."""
    text = " ".join(previous).strip()
    if context_chars <= 0 or not text:
        return ""
    if len(text) <= context_chars:
        return text
    tail = text[-context_chars:]
    head, space, rest = tail.partition(" ")
    return "..." + (rest if space and rest else tail)


def rewrite_messages(chunk: str, previous: list[str], style: str, context_chars: int) -> list[Message]:
    """System + user message asking for `chunk` rewritten in `style`, after the rewritten chunks `previous`."""
    context = context_text(previous, context_chars)
    shown = CONTEXT_SO_FAR.format(text=block("rewritten_so_far", context)) if context else CONTEXT_START
    user = REWRITE_USER.format(style=block("style", style), context=shown, chunk=block("passage", chunk))
    return [Message(role="system", content=REWRITE_SYSTEM), Message(role="user", content=user)]


def judge_messages(source: str, rewrite: str) -> list[Message]:
    """System + user message asking whether `rewrite` is faithful to `source`."""
    user = JUDGE_USER.format(source=block("source", source), rewrite=block("rewrite", rewrite))
    return [Message(role="system", content=JUDGE_SYSTEM), Message(role="user", content=user)]


def strip_thinking(reply: str) -> str:
    """The answer part of a reply: after the last `</think>` (an unclosed `<think>` leaves nothing), without
    surrounding whitespace, code fences or triple quotes."""
    if "</think>" in reply:
        reply = reply.rpartition("</think>")[2]
    elif reply.lstrip().startswith("<think>"):
        return ""
    text = reply.strip()
    for fence in ('"""', "```"):
        if text.startswith(fence) and text.endswith(fence) and len(text) >= 2 * len(fence):
            text = text[len(fence) : -len(fence)].strip()
    return text
