"""A small byte-level BPE tokenizer with K2's special tokens, trained offline in seconds.

No hub downloads: the training corpus is generated (`build_corpus`): English-ish sentences,
arithmetic Q&A, JSON tool-call snippets, code-like lines and rendered K2 chat dialogues, so
the merges cover `functions.`, JSON punctuation and digits. The special tokens get ids
0..13 in `SPECIAL_TOKENS` order; pad = `<|pad|>`, eos = `<|im_end|>` (the generation stop
token), no bos; the chat template is `CHAT_TEMPLATES[chat_format]` (K2-Instruct's by default, K2-Thinking's
with `chat_format="thinking"`; the vocabulary is the same for both). Same seed -> same vocabulary.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)
from transformers import PreTrainedTokenizerFast

from k2post.chat.template import CHAT_TEMPLATES, SPECIAL_TOKEN_SPLIT, ChatFormat, check_chat_format, render_text
from k2post.chat.tokens import IM_END, PAD, SPECIAL_TOKENS
from k2post.chat.types import Message, ToolCall, ToolSpec, dump_json, format_call_id

MODEL_MAX_LENGTH = 4096
DEFAULT_CORPUS_LINES = 12_000
BYTE_ALPHABET_SIZE = 256

_NOUNS = (
    "cat dog river city model teacher student house garden engine window market table letter "
    "mountain forest planet number question answer function server file bridge computer song "
    "doctor farmer child friend story language system network signal bird ocean road train "
    "machine book paper idea music kitchen village country summer winter morning evening"
).split()
_ADJECTIVES = (
    "small large quick slow bright dark happy quiet old new green red blue simple complex "
    "strange careful clever gentle heavy light warm cold ancient modern empty busy"
).split()
_VERBS = (
    "sees finds builds reads writes carries opens closes follows watches helps moves checks "
    "counts paints visits explains remembers answers computes returns sends"
).split()
_PLACES = "park school station library office harbor valley museum lab desert".split()
_NAMES = "Alice Bob Carol David Emma Farid Grace Hiro Ines Jamal Kenji Lena Mira Noor Omar".split()
_CITIES = "Paris Tokyo Lagos Lima Oslo Cairo Delhi Seoul Berlin Quito Nairobi Hanoi".split()
_UNICODE_WORDS = "café naïve über señor 東京 北京 данные привет γεια مرحبا 😀 ✓ → ∑ π".split()

_ONSETS = "b bl br c ch cr d dr f fl g gr h j k l m n p pl pr qu r s sh st str t th tr v w wh y z".split()
_VOWELS = "a e i o u ai ea ee oa oo ou ie".split()
_CODAS = "- - - n nd ng nt r rd rt s st t ck ll m mp sh th ld lt x".split()
_SUFFIXES = "- - - s ed ing er ly tion ment ness able ful est ize".split()


def _pseudo_word(rng: random.Random) -> str:
    """An English-looking made-up word (gives BPE many plausible sub-words to merge)."""
    syllables = "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(rng.randint(1, 3))
    )
    return (syllables + rng.choice(_SUFFIXES)).replace("-", "")


_TOOLS = (
    ToolSpec(
        name="get_weather",
        description="Current weather in a city.",
        parameters={
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    ),
    ToolSpec(
        name="calculator",
        description="Evaluate an arithmetic expression.",
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    ),
    ToolSpec(
        name="search",
        description="Search the web.",
        parameters={
            "type": "object",
            "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
            "required": ["query"],
        },
    ),
    ToolSpec(
        name="read_file",
        description="Read a text file.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    ),
)


def _sentence(rng: random.Random) -> str:
    """One English-ish template sentence."""
    patterns = (
        "The {a} {n} {v} the {n2} near the {p}.",
        "{name} {v} a {a} {n} every {t}.",
        "Why does the {n} {vb} so {a2} in the {p}?",
        "In {city}, the {n} is {a} and the {n2} is {a2}.",
        '{name} said: "I think the {n} is {a}, but the {n2} {v} it."',
        "A {a} {n} and {k} {a2} {n2}s were seen at the {p} ({w}).",
        "The {x} of {name} {v} {y} {z}, and {x2} {y2}.",
        "{X} {y} the {a} {z} with {k}% {x2}.",
    )
    x, x2, y, y2, z = (_pseudo_word(rng) for _ in range(5))
    return rng.choice(patterns).format(
        a=rng.choice(_ADJECTIVES),
        a2=rng.choice(_ADJECTIVES),
        n=rng.choice(_NOUNS),
        n2=rng.choice(_NOUNS),
        v=rng.choice(_VERBS),
        vb=rng.choice(_VERBS).removesuffix("s"),
        p=rng.choice(_PLACES),
        name=rng.choice(_NAMES),
        city=rng.choice(_CITIES),
        t=rng.choice(("day", "week", "year")),
        k=rng.randint(2, 99),
        w=rng.choice(_UNICODE_WORDS),
        x=x,
        X=x.title(),
        x2=x2,
        y=y,
        y2=y2,
        z=z,
    )


def _arithmetic(rng: random.Random) -> str:
    """An arithmetic question with its answer."""
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    op, value = rng.choice((("+", a + b), ("-", a - b), ("*", a * b)))
    return f"What is {a} {op} {b}? The answer is {value}."


def _random_arguments(rng: random.Random, tool: ToolSpec) -> dict[str, object]:
    """Plausible arguments for one of the corpus tools."""
    by_tool: dict[str, Callable[[], dict[str, object]]] = {
        "get_weather": lambda: {
            "city": rng.choice(_CITIES),
            "unit": rng.choice(("celsius", "fahrenheit")),
        },
        "calculator": lambda: {"expression": f"{rng.randint(1, 99)} * ({rng.randint(1, 99)} + {rng.randint(1, 9)})"},
        "search": lambda: {
            "query": f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}",
            "top_k": rng.randint(1, 10),
        },
        "read_file": lambda: {"path": f"/data/{rng.choice(_NOUNS)}_{rng.randint(0, 99)}.txt"},
    }
    return by_tool[tool.name]()


def _tool_call_snippet(rng: random.Random) -> str:
    """A JSON tool-call object as an API would log it."""
    tool = rng.choice(_TOOLS)
    return dump_json(
        {
            "id": format_call_id(tool.name, rng.randint(0, 20)),
            "name": tool.name,
            "arguments": _random_arguments(rng, tool),
        }
    )


def _code_line(rng: random.Random) -> str:
    """A Python-looking line of code."""
    name, other = _pseudo_word(rng), rng.choice(_NOUNS)
    lines = (
        f"def {name}_{rng.choice(_VERBS)}({other}, n={rng.randint(0, 9)}):",
        f"    return [{other} * i for i in range({rng.randint(1, 64)})]",
        f"for i, {name} in enumerate({other}s):",
        f"    if {name} is None or len({other}) > {rng.randint(1, 100)}:",
        f'{name} = {{"{other}": {rng.randint(0, 999)}, "ok": {rng.choice(("True", "False"))}}}',
        f'print(f"{{{name}!r}} -> {{{other}:.3f}}")',
        f"import {name}; from {other}.{name} import {other.title()}",
    )
    return rng.choice(lines)


def _dialogue(rng: random.Random) -> str:
    """A rendered K2 dialogue (either format, with or without a system message, so the default one is seen too):
    question, thinking + one tool call, tool result, answer."""
    tool = rng.choice(_TOOLS)
    call = ToolCall(id=format_call_id(tool.name, 0), name=tool.name, arguments=_random_arguments(rng, tool))
    system = [Message(role="system", content="You are a helpful assistant.")] if rng.random() < 0.5 else []
    messages = [
        *system,
        Message(role="user", content=_sentence(rng) + " " + _arithmetic(rng).split("?")[0] + "?"),
        Message(role="assistant", reasoning=_sentence(rng), content="", tool_calls=[call]),
        Message(role="tool", tool_call_id=call.id, content=_sentence(rng), name=tool.name),
        Message(role="assistant", content=_arithmetic(rng).split("? ")[1]),
    ]
    chat_format = rng.choice(("instruct", "thinking"))
    return render_text(messages, tools=list(_TOOLS), chat_format=chat_format, last_turn_open=True)


_LINE_MAKERS: tuple[Callable[[random.Random], str], ...] = (
    _sentence,
    _sentence,
    _arithmetic,
    _tool_call_snippet,
    _code_line,
    _dialogue,
)


def build_corpus(n_lines: int, seed: int) -> list[str]:
    """`n_lines` generated training texts (a dialogue counts as one); same seed, same corpus."""
    rng = random.Random(seed)
    return [rng.choice(_LINE_MAKERS)(rng) for _ in range(n_lines)]


def _training_pieces(corpus: list[str]) -> Iterator[str]:
    """Corpus texts with the special tokens cut out (they are never merged with text)."""
    for text in corpus:
        for piece in SPECIAL_TOKEN_SPLIT.split(text):
            if piece and piece not in SPECIAL_TOKENS:
                yield piece


# The normalizer (NFC) and pre-tokenizer split are the ones transformers' Qwen2Tokenizer
# rebuilds when `AutoTokenizer` loads a model dir whose config says model_type "qwen2"
# (transformers 5.x forces that class for qwen2 whatever tokenizer_config.json says).
# Training with the same pipeline makes every loader -- ours, AutoTokenizer, vLLM -- encode
# identically; tests/k2post/models/test_tokenizer.py checks it on saved model dirs.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _train_bpe(corpus: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE over the corpus; the special tokens take ids 0..13."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_pieces(corpus), trainer=trainer)
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False, lstrip=False, rstrip=False) for token in SPECIAL_TOKENS]
    )
    return tokenizer


def build_tokenizer(
    vocab_size: int = 4096, seed: int = 0, chat_format: ChatFormat = "instruct"
) -> PreTrainedTokenizerFast:
    """Train the K2 byte-level BPE tokenizer (at most `vocab_size` ids, special tokens 0..13) with the chat template
    of `chat_format`."""
    check_chat_format(chat_format)
    minimum = BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be at least {minimum} (256 bytes + special tokens), got {vocab_size}")
    trained = _train_bpe(build_corpus(DEFAULT_CORPUS_LINES, seed), vocab_size)
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if trained.token_to_id(token) != expected_id:
            got = trained.token_to_id(token)
            raise RuntimeError(f"special token {token!r} got id {got}, expected {expected_id}")
    return PreTrainedTokenizerFast(
        tokenizer_object=trained,
        pad_token=PAD,
        eos_token=IM_END,
        bos_token=None,
        extra_special_tokens=[token for token in SPECIAL_TOKENS if token not in (PAD, IM_END)],
        model_max_length=MODEL_MAX_LENGTH,
        chat_template=CHAT_TEMPLATES[chat_format],
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tok: PreTrainedTokenizerFast, out_dir: str | Path) -> Path:
    """Write the tokenizer (and its chat template) for `AutoTokenizer.from_pretrained(out_dir)`."""
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(path))
    return path
