"""K2's special tokens, shared by the tokenizer builder, the chat template and the parser.

The chat tokens are Kimi K2's as shipped (docs/CHAT_TEMPLATE.md): a message starts with `<|im_user|>`,
`<|im_assistant|>` or `<|im_system|>` (system, tool results and the tool declaration), its name, then
`<|im_middle|>`; it ends with `<|im_end|>`. There is no `<|im_begin|>`. `<|pad|>` and `<|endoftext|>` are the tiny
tokenizer's own pad and end-of-text tokens, not part of the chat format.
"""

import re

IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_SYSTEM = "<|im_system|>"
IM_MIDDLE = "<|im_middle|>"
IM_END = "<|im_end|>"
TOOL_CALLS_BEGIN = "<|tool_calls_section_begin|>"
TOOL_CALLS_END = "<|tool_calls_section_end|>"
TOOL_CALL_BEGIN = "<|tool_call_begin|>"
TOOL_CALL_ARG_BEGIN = "<|tool_call_argument_begin|>"
TOOL_CALL_END = "<|tool_call_end|>"
THINK_BEGIN = "<think>"
THINK_END = "</think>"
PAD = "<|pad|>"
EOS = "<|endoftext|>"

MESSAGE_STARTS: tuple[str, ...] = (IM_USER, IM_ASSISTANT, IM_SYSTEM)
"""The tokens that open a message (a generated turn ends before any of them)."""

CHAT_TOKENS: tuple[str, ...] = (
    IM_USER,
    IM_ASSISTANT,
    IM_SYSTEM,
    IM_MIDDLE,
    IM_END,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
    TOOL_CALL_BEGIN,
    TOOL_CALL_ARG_BEGIN,
    TOOL_CALL_END,
    THINK_BEGIN,
    THINK_END,
)
"""The tokens the chat template writes: each must be one id (`k2post model prepare` adds the missing ones)."""

TOKEN_SHAPED = re.compile(r"<([|｜])([^<>|｜\s]{1,64})([|｜])>|<(/?think|start_of_turn|end_of_turn)>", re.IGNORECASE)
"""Special-token-shaped strings: `<|name|>` (K2, Qwen, Llama 3, Phi, ...), DeepSeek's `<｜name｜>`, Gemma's
`<start_of_turn>` / `<end_of_turn>`, and the think tags."""


def defuse_special_tokens(text: str) -> str:
    """`text` with every special-token-shaped string broken by a space after `<` (`<|im_end|>` -> `< |im_end|>`), so
    no tokenizer that re-reads the text parses it as a special token. For text that must travel as text to a
    server that renders and re-tokenizes it (an OpenAI-compatible endpoint); idempotent."""
    return TOKEN_SHAPED.sub(lambda match: "< " + match.group(0)[1:], text)


# Order matters: ids are assigned in this order, starting at 0, by the tokenizer builder.
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, *CHAT_TOKENS)
