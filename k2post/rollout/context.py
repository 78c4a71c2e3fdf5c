"""Context management of long tool episodes: the elision rule, one pure function used by rollout and checks.

Once an episode's context passes `ContextConfig.budget_tokens` at the start of a turn, the dialogue is cut down:
the task prompt (everything before the first assistant turn) and the last `keep_last_turns` assistant turns with
their tool results stay verbatim (so the current tool-calling turns keep their reasoning, as K2 Thinking does);
every turn in between, with its results and reasoning, becomes one system note. The episode goes on in a new
*window* whose prompt is that elided dialogue rendered; each window is trained as its own row on exactly the
tokens the engine saw, so rollout and trainer agree by construction (`elided_prompt_ids` re-derives a window's
prompt from the dialogue, and tests check it against what the engine was given).

    messages, turns = elide_messages(dialogue, keep_last_turns=4, placeholder="[{turns} turns elided]")

The rule is a function of the full dialogue: eliding again later elides a superset (a turn never comes back).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from k2post.chat.template import render_transcript_ids
from k2post.chat.types import Message, ToolSpec


def elide_messages(messages: Sequence[Message], keep_last_turns: int, placeholder: str) -> tuple[list[Message], int]:
    """The dialogue with every assistant turn but the last `keep_last_turns` (and the messages that follow each)
    collapsed into one system note; and the number of assistant turns elided (0: unchanged)."""
    turns = [index for index, message in enumerate(messages) if message.role == "assistant"]
    if len(turns) <= keep_last_turns:
        return list(messages), 0
    first, cut = turns[0], (turns[-keep_last_turns] if keep_last_turns else len(messages))
    dropped = messages[first:cut]
    elided = sum(message.role == "assistant" for message in dropped)
    results = sum(message.role == "tool" for message in dropped)
    note = Message(role="system", content=placeholder.format(turns=elided, results=results))
    return [*messages[:first], note, *messages[cut:]], elided


def elided_prompt_ids(tokenizer: Any, messages: Sequence[Message], tools: Sequence[ToolSpec], cfg: Any) -> list[int]:
    """The token prompt of a window that starts after `messages` (the elided dialogue + generation prompt)."""
    elided, _ = elide_messages(messages, cfg.keep_last_turns, cfg.placeholder)
    return render_transcript_ids(tokenizer, elided, tools, add_generation_prompt=True).input_ids
