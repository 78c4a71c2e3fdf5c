"""K2 chat format: typed messages, the K2 template (text, token ids + loss mask, HF Jinja),
and a never-raising parser for generated assistant turns."""

from k2post.chat.parse import ParsedAssistant, ToolCallParseError, parse_assistant
from k2post.chat.template import (
    CHAT_TEMPLATE_JINJA,
    GENERATION_PROMPT,
    RenderedChat,
    assign_tool_call_ids,
    render_assistant_body,
    render_continuation_ids,
    render_ids,
    render_text,
    validate_dialogue,
)
from k2post.chat.types import Message, ToolCall, ToolSpec, dialogue_from_openai

__all__ = [
    "CHAT_TEMPLATE_JINJA",
    "GENERATION_PROMPT",
    "Message",
    "ParsedAssistant",
    "RenderedChat",
    "ToolCall",
    "ToolCallParseError",
    "ToolSpec",
    "assign_tool_call_ids",
    "dialogue_from_openai",
    "parse_assistant",
    "render_assistant_body",
    "render_continuation_ids",
    "render_ids",
    "render_text",
    "validate_dialogue",
]
