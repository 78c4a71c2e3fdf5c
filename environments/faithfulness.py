"""Faithfulness gym: answer a question from a context; reward = fraction of supported sentences.

    env = make_environment("faithfulness")                       # judge "lexical_fallback"
    task = next(env.tasks("train", seed=0))
    env.score(task, "The lamp was electrified in 1931.")         # breakdown {"sentence_0": 1.0}

The response is split into sentences; each sentence with content words is judged "supported by
the context" or not, and the reward is supported / judged. Sentences without content words
("Sure!") are skipped; a response with none scores 0. At most `max_sentences` sentences are
judged: the rest count as unsupported, so rambling does not pay.

Judges (`judge` config):
- "lexical_fallback" (default): `LexicalOverlapJudgeFallback`, a crude stand-in needing no model: a
  sentence is supported when at least `overlap_threshold` of its claim words (content words:
  lowercased, stopwords dropped, -s/-es/-ed/-ing folded; minus words of the question, which
  restating claims nothing) occur in the best-matching context sentence and the two agree on
  negation (not/never/n't). It cannot see paraphrases; prefer a trained or LLM judge when you can.
- "trained": `TrainedModelJudge`, a sentence-level faithfulness model fine-tuned with `k2post judge train`
  (k2post/judging/faithfulness_model.py; set `judge_model` to its out_dir): every sentence of a response is
  scored in one batch, supported when P(supported) reaches the threshold picked on its dev pairs. K2's
  faithfulness gym rewards with such a model; benchmarks/faithfulness_judge.py compares it with the fallback.
- "llm": `LLMSentenceJudge` asks an `LLMClient` (k2post.llm.client) once per sentence "Is this
  sentence supported by the context? Answer yes/no" and parses the reply robustly. Pass the
  client to the constructor, or name a zero-argument factory as `judge_client_factory`
  ("module:callable") so reward workers can build it from the config.

Tasks: the built-in set `environments/data/faithfulness.jsonl` (20 items written for this gym) or
`data_path` (JSONL with id, context, question); every `test_every`-th item is held out as test,
the item after each as dev (`k2post.envs.splits.every_split`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import Field

from k2post_environments.answer_extraction import SPECIAL_TOKEN
from k2post.chat.types import Message
from k2post.chat.untrusted import block
from k2post.envs.base import EnvConfig, Environment, Reward, Split, Task
from k2post.envs.registry import register_environment
from k2post.envs.splits import check_split, every_split
from k2post.llm.client import LLMClient, load_client_factory

BUILTIN_DATA = Path(__file__).parent / "data" / "faithfulness.jsonl"
PROMPT = (
    "Answer the question using only information from the context. Keep the answer short.\n\n"
    "Context:\n{context}\n\nQuestion: {question}"
)
JUDGE_SYSTEM = "You check whether a sentence is supported by a context. Reply with yes or no."
JUDGE_PROMPT = "{context}\n\n{sentence}\n\nIs this sentence supported by the context? Answer yes or no."
"""The context and the sentence are untrusted: each goes in its escaped block (`k2post.chat.untrusted.block`)."""
STOPWORDS = frozenset(
    """a an the and or but if then so of to in on at by for with from into onto over under about as is are was
    were be been being am do does did doing have has had having it its it's this that these those there here
    i you he she we they me him her us them my your his our their what which who whom whose when where why how
    not no yes can could will would shall should may might must also just very only than too more most some any
    all each every both few many much such own same other again further once up down out off s t
    sure okay ok certainly course well hello hi thanks thank please indeed
    answer question context text passage according based mentioned mention state states say says
    never none nothing neither nor cannot""".split()
)
"""Function words, fillers ("Sure!") and words about the task itself ("according to the context")."""
_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_LIST_MARKER = re.compile(r"^\s*(?:[*\-•]|\d+[.)])\s+")
_VERDICT = re.compile(r"\b(not supported|unsupported|yes|no|supported)\b")
NEGATIONS = frozenset("not no never none nothing nobody neither nor cannot without".split())
ERROR_CHARS = 300
SHOWN_CHARS = 200


def stem(token: str) -> str:
    """A tiny suffix folder (-ing, -ed, -es, -s) so closes/closed/closing meet; not a real stemmer."""
    for suffix in ("ing", "ed", "es", "s"):
        if token.endswith(suffix) and len(token) - len(suffix) >= 3 and not token.endswith("ss"):
            return token[: -len(suffix)]
    return token


def content_words(text: str) -> frozenset[str]:
    """Lowercased, stemmed words minus stopwords, negations and 1-letter words (possessive 's dropped)."""
    result = set()
    for token in _TOKEN.findall(text.lower()):
        token = re.sub(r"['’]s$", "", token)
        if token not in STOPWORDS and not token.endswith(("n't", "n’t")) and (len(token) > 1 or token.isdigit()):
            result.add(stem(token))
    return frozenset(result)


def split_sentences(text: str) -> list[str]:
    """Sentences: lines (list markers stripped) split after . ! ? + whitespace."""
    sentences = []
    for line in text.splitlines():
        line = _LIST_MARKER.sub("", line)
        sentences.extend(piece.strip() for piece in _SENTENCE_END.split(line) if piece.strip())
    return sentences


def negated(text: str) -> bool:
    """True when the text has a negation word (not, no, never, none, ..., or an n't form)."""
    return any(token in NEGATIONS or token.endswith(("n't", "n’t")) for token in _TOKEN.findall(text.lower()))


@lru_cache(maxsize=256)
def _context_index(context: str) -> tuple[tuple[frozenset[str], bool], ...]:
    """Per context sentence: its content words and whether it is negated."""
    return tuple((content_words(sentence), negated(sentence)) for sentence in split_sentences(context))


@dataclass(frozen=True)
class SentenceVerdict:
    """One sentence's judgement: supported (None = no usable verdict) and a short detail."""

    supported: bool | None
    detail: str = ""


class SentenceJudge(Protocol):
    """Judges one response sentence against the context."""

    name: str

    def judge(self, context: str, sentence: str, question: str = "") -> SentenceVerdict:
        """Whether `sentence` is supported by `context` (`question` is what it answers)."""
        ...


class LexicalOverlapJudgeFallback:
    """FALLBACK judge (no model): supported when content-word overlap with the best-matching context
    sentence is at least `threshold` and both agree on negation. Crude; blind to paraphrase."""

    name = "lexical_fallback"

    def __init__(self, threshold: float = 0.6) -> None:
        self.threshold = threshold

    def best_match(self, context: str, sentence: str, question: str = "") -> tuple[float, bool]:
        """Largest fraction of the sentence's claim words found in one context sentence, and whether
        that context sentence has the same polarity (negated or not) as the sentence. Claim words are
        the content words not already in the question (restating the question claims nothing);
        a sentence made only of question words is compared with all its content words."""
        words = content_words(sentence)
        words = (words - content_words(question)) or words
        scored = [(len(words & ctx) / len(words), neg) for ctx, neg in _context_index(context)] if words else []
        if not scored:
            return 0.0, False
        overlap, ctx_negated = max(scored, key=lambda item: item[0])
        return overlap, ctx_negated == negated(sentence)

    def judge(self, context: str, sentence: str, question: str = "") -> SentenceVerdict:
        overlap, same_polarity = self.best_match(context, sentence, question)
        detail = f"overlap={overlap:.2f}" + ("" if same_polarity else " negation mismatch")
        return SentenceVerdict(overlap >= self.threshold and same_polarity, detail)


def parse_yes_no(reply: str) -> bool | None:
    """The first yes/no (or supported/unsupported) in a judge reply; None when there is none."""
    text = reply.rsplit("</think>", 1)[-1].lower()
    match = _VERDICT.search(text)
    if match is None:
        return None
    return match.group(1) in ("yes", "supported")


def judge_prompt(context: str, sentence: str) -> str:
    """The sentence judge's user message: the context and the sentence in escaped blocks, then the question."""
    return JUDGE_PROMPT.format(context=block("context", context), sentence=block("sentence", sentence))


class LLMSentenceJudge:
    """Asks an `LLMClient` per sentence whether the context supports it."""

    name = "llm"

    def __init__(self, client: LLMClient, chat_kwargs: dict[str, Any] | None = None) -> None:
        self.client = client
        self.chat_kwargs = chat_kwargs or {}

    def judge(self, context: str, sentence: str, question: str = "") -> SentenceVerdict:
        messages = [
            Message(role="system", content=JUDGE_SYSTEM),
            Message(role="user", content=judge_prompt(context, sentence)),
        ]
        try:
            reply = self.client.chat(messages, **self.chat_kwargs)
        except Exception as err:  # a flaky judge must not crash scoring
            return SentenceVerdict(None, f"client error: {type(err).__name__}: {err}"[:ERROR_CHARS])
        verdict = parse_yes_no(reply if isinstance(reply, str) else str(reply))
        return SentenceVerdict(verdict, "" if verdict is not None else f"unparsed reply: {str(reply)[:ERROR_CHARS]!r}")


class TrainedModelJudge:
    """A fine-tuned sentence-level faithfulness model (`k2post judge train`), loaded once per process."""

    name = "trained"

    def __init__(self, path: str) -> None:
        from k2post.judging.faithfulness_model import cached_trained_judge

        self.model = cached_trained_judge(path)

    def judge_many(self, context: str, sentences: list[str]) -> list[SentenceVerdict]:
        """All sentences against the context in one batch."""
        probs = self.model.supported_probs([(context, sentence) for sentence in sentences])
        return [SentenceVerdict(prob >= self.model.threshold, f"p={prob:.2f}") for prob in probs]

    def judge(self, context: str, sentence: str, question: str = "") -> SentenceVerdict:
        return self.judge_many(context, [sentence])[0]


class FaithfulnessConfig(EnvConfig):
    """Config of the `faithfulness` gym."""

    judge: Literal["lexical_fallback", "trained", "llm"] = Field(
        "lexical_fallback",
        description="Sentence judge: the lexical-overlap fallback, a model from `k2post judge train` (judge_model), "
        "or an LLM via LLMClient.",
    )
    judge_model: str | None = Field(
        None, description="trained judge: a `k2post judge train` out_dir (or its model/ dir)."
    )
    overlap_threshold: float = Field(
        0.6, ge=0.0, le=1.0, description="lexical_fallback: least content-word overlap for a supported sentence."
    )
    judge_client_factory: str | None = Field(
        None, description="llm judge: 'module:callable' returning an LLMClient (used when no client is passed)."
    )
    judge_chat_kwargs: dict[str, Any] = Field(
        default_factory=lambda: {"temperature": 0.0, "max_tokens": 16}, description="llm judge: chat() options."
    )
    data_path: str | None = Field(None, description="JSONL of {id, context, question}; default: the built-in set.")
    test_every: int = Field(
        5, ge=2, description="Every test_every-th item (index 0, k, 2k, ...) is test, the next one dev (when >= 3)."
    )
    max_response_chars: int = Field(20000, gt=0, description="Only the first N chars of a response are judged.")
    max_sentences: int = Field(
        32, gt=0, description="Most sentences judged; later content sentences count as unsupported."
    )


@lru_cache(maxsize=8)
def load_items(path: str) -> tuple[dict[str, str], ...]:
    """The (id, context, question) items of a JSONL file (blank lines skipped)."""
    items = []
    for line_no, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            items.append({"id": str(row.get("id", line_no)), "context": row["context"], "question": row["question"]})
    return tuple(items)


@register_environment
class FaithfulnessEnv(Environment):
    """Context-grounded QA; rewards answers whose sentences the context supports."""

    name = "faithfulness"
    task_type = "faithfulness"
    reward_range = (0.0, 1.0)
    config_cls = FaithfulnessConfig
    config: FaithfulnessConfig

    def __init__(self, config: FaithfulnessConfig | None = None, client: LLMClient | None = None) -> None:
        super().__init__(config)
        self.judge = self._make_judge(client)

    def _make_judge(self, client: LLMClient | None) -> SentenceJudge:
        if self.config.judge == "lexical_fallback":
            return LexicalOverlapJudgeFallback(self.config.overlap_threshold)
        if self.config.judge == "trained":
            if not self.config.judge_model:
                raise ValueError("faithfulness judge 'trained' needs judge_model: a `k2post judge train` out_dir")
            return TrainedModelJudge(self.config.judge_model)
        if client is None and self.config.judge_client_factory:
            client = load_client_factory(self.config.judge_client_factory)
        if client is None:
            raise ValueError(
                "faithfulness judge 'llm' needs an LLMClient: pass client=... or set judge_client_factory "
                "('module:callable'); or use judge: lexical_fallback"
            )
        return LLMSentenceJudge(client, dict(self.config.judge_chat_kwargs))

    def tasks(self, split: Split = "train", seed: int = 0, n: int | None = None) -> Iterator[Task]:
        """Test: every `test_every`-th item, dev: the item after each (file order); train: the others,
        shuffled by seed (no shifted split)."""
        check_split(self.name, split)
        items = load_items(self.config.data_path or str(BUILTIN_DATA))
        chosen = [item for index, item in enumerate(items) if every_split(index, self.config.test_every) == split]
        if split == "train":
            random.Random(f"faithfulness:{seed}").shuffle(chosen)
        for item in chosen[: n if n is not None else len(chosen)]:
            yield Task(
                id=f"faithfulness-{item['id']}",
                env=self.name,
                task_type=self.task_type,
                messages=[Message(role="user", content=PROMPT.format(**item))],
                answer={"context": item["context"], "question": item["question"]},
                metadata={"source": self.config.data_path or "builtin"},
            )

    def _judge_all(self, context: str, question: str, sentences: list[str]) -> list[SentenceVerdict]:
        if isinstance(self.judge, TrainedModelJudge):
            return self.judge.judge_many(context, sentences[: self.config.max_sentences])
        return [self.judge.judge(context, sentence, question) for sentence in sentences[: self.config.max_sentences]]

    def score(self, task: Task, response: str) -> Reward:
        """Fraction of content sentences the judge calls supported (see module doc)."""
        if not isinstance(response, str):
            response = "" if response is None else str(response)
        gold = task.answer if isinstance(task.answer, dict) else {"context": str(task.answer or "")}
        context, question = str(gold.get("context", "")), str(gold.get("question", ""))
        text = SPECIAL_TOKEN.sub(" ", response.rsplit("</think>", 1)[-1][: self.config.max_response_chars])
        sentences = [sentence for sentence in split_sentences(text) if content_words(sentence)]
        shown = [sentence[:SHOWN_CHARS] for sentence in sentences[: self.config.max_sentences]]
        info: dict[str, Any] = {"judge": self.judge.name, "sentences": shown}
        if not sentences:
            return Reward(value=0.0, info={**info, "reason": "no sentence with content words"})
        verdicts = self._judge_all(context, question, sentences)
        breakdown = {f"sentence_{index}": float(bool(v.supported)) for index, v in enumerate(verdicts)}
        info["details"] = [verdict.detail for verdict in verdicts]
        info["unjudged"] = len(sentences) - len(verdicts)
        value = sum(breakdown.values()) / len(sentences)
        if all(verdict.supported is None for verdict in verdicts):
            error = f"judge gave no verdict: {verdicts[0].detail}"
            return Reward(value=0.0, breakdown=breakdown, info=info, error=error)
        return Reward(value=value, breakdown=breakdown, info=info)
