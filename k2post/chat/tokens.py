"""K2's special tokens, shared by the tokenizer builder and the chat template.

The strings follow Kimi K2 as shipped (the format: k2post/chat/template.py and docs/CHAT_TEMPLATE.md).
"""

IM_BEGIN = "<|im_begin|>"
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

# Order matters: ids are assigned in this order, starting at 0, by the tokenizer builder.
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD,
    EOS,
    IM_BEGIN,
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
