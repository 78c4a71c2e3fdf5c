"""K2 chat format: typed messages, the K2 templates as shipped (instruct and thinking: text, token ids + loss mask,
HF Jinja), and a never-raising parser for generated assistant turns."""

from k2post.chat.parse import ParsedAssistant, ToolCallParseError, parse_assistant
from k2post.chat.template import (
    CHAT_FORMATS,
    CHAT_TEMPLATES,
    DEFAULT_SYSTEM_PROMPT,
    GENERATION_PROMPTS,
    ChatFormat,
    RenderedChat,
    assign_tool_call_ids,
    chat_format,
    render_assistant_body,
    render_continuation_ids,
    render_ids,
    render_text,
    validate_dialogue,
)
from k2post.chat.types import Message, ToolCall, ToolSpec, dialogue_from_openai

__all__ = [
    "CHAT_FORMATS",
    "CHAT_TEMPLATES",
    "DEFAULT_SYSTEM_PROMPT",
    "GENERATION_PROMPTS",
    "ChatFormat",
    "Message",
    "ParsedAssistant",
    "RenderedChat",
    "ToolCall",
    "ToolCallParseError",
    "ToolSpec",
    "assign_tool_call_ids",
    "chat_format",
    "dialogue_from_openai",
    "parse_assistant",
    "render_assistant_body",
    "render_continuation_ids",
    "render_ids",
    "render_text",
    "validate_dialogue",
]
