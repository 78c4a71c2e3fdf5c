"""Untrusted text inside the prompts k2post builds: rendered as text, never as structure.

Untrusted text is whatever k2post did not write itself: policy output, tool results, dataset rows, rubric and spec
text. Three layers keep it text:

- token ids: `template.render_ids` makes only the renderer's own tokens special; a `<|im_end|>` written inside a
  message is tokenized as ordinary text (`split_special_tokens=True`);
- text that a server re-tokenizes (an OpenAI-compatible endpoint): `tokens.defuse_special_tokens` breaks every
  special-token-shaped string (`<|im_end|>` -> `< |im_end|>`); `HTTPLLMClient` applies it to every message;
- the text frames of judge, simulator and rewrite prompts: untrusted text goes only inside `block(tag, text)`,
  whose `escape_untrusted` defuses the frame tags (`FRAME_TAGS`: `</response_a>` -> `(/response_a)`) and the
  `[role]` lines of the judge's conversation block (`[assistant]` -> `(assistant)`), splits the
  verdict brackets (`[[A]]` -> `[ [A] ]`) and defuses special tokens, so the text cannot close its block, open
  another, or carry a verdict token the parser would read if the judge echoed it.

    user = "\\n\\n".join([block("context", source), block("sentence", claim), "Is the sentence supported?"])
"""

from __future__ import annotations

import re

from k2post.chat.tokens import defuse_special_tokens

FRAME_TAGS = (
    "conversation",
    "response_a",
    "response_b",
    "context",
    "sentence",
    "transcript",
    "rubric",
    "source",
    "rewrite",
    "passage",
    "rewritten_so_far",
    "style",
    "goal",
    "tool_spec",
    "world",
    "earlier_calls",
    "call",
)
"""Every delimiter tag a k2post prompt frames untrusted text with; `escape_untrusted` defuses all of them."""

_TAG_RE = re.compile(r"<\s*(/?)\s*(" + "|".join(FRAME_TAGS) + r")\s*>", re.IGNORECASE)
_ROLE_LINE = re.compile(r"^[ \t]*\[\s*(system|user|assistant|tool)\s*\][ \t]*$", re.IGNORECASE | re.MULTILINE)
"""A `[role]` line: how the judge's conversation block starts each message."""


def escape_untrusted(text: str) -> str:
    """`text` with frame tags and `[role]` lines defused, `[[` / `]]` split and special-token strings defused
    (module docstring)."""
    text = _TAG_RE.sub(lambda m: f"({m.group(1)}{m.group(2)})", defuse_special_tokens(text))
    text = _ROLE_LINE.sub(lambda m: f"({m.group(1)})", text)
    while "[[" in text or "]]" in text:
        text = text.replace("[[", "[ [").replace("]]", "] ]")
    return text


def block(tag: str, text: str) -> str:
    """`<tag>` / escaped text / `</tag>` on their own lines; `tag` must be one of `FRAME_TAGS`."""
    if tag not in FRAME_TAGS:
        raise ValueError(f"frame tag {tag!r} is not in FRAME_TAGS (escape_untrusted would not defuse it)")
    return f"<{tag}>\n{escape_untrusted(text)}\n</{tag}>"
