"""Fidelity of a rewritten chunk to its source chunk: the deterministic checks (the numbers, dates and named
entities of the source must survive; no number may be invented) and the `ChunkJudge`s the rephraser asks.

    missing = missing_facts(source_chunk, rewritten_chunk)    # [] when every number and name survived
    verdict = ChecksJudge().judge(source_chunk, rewritten_chunk)           # ChunkVerdict(faithful, score, reason)
    verdict = LLMChunkJudge(client).judge(source_chunk, rewritten_chunk)   # checks, then a judge call
    verdict = ModelChunkJudge(trained).judge(source_chunk, rewritten_chunk)  # checks, then a trained judge

Every judge runs the checks first (a rewrite that lost a number is unfaithful whatever a model says) and never
raises on a bad reply: an unreadable or failed judge call is an unfaithful verdict with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from k2post.rephrase.chunking import split_sentences
from k2post.rephrase.prompts import judge_messages, strip_thinking

_NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.,])\d+(?:\.\d+)?(?![\w])")
_CAPITALIZED = re.compile(r"\b[A-Z][a-z]+(?:[-'][A-Za-z]+)*\b")
_MONTHS = ("January February March April May June July August September October November December").split()
# sentence starters that are capitalized only because they start a sentence
_STARTERS = frozenset(
    "A An The This That These Those It Its In On At By For From With Without Of To As After Before During When "
    "While If Then There Here Today You We They He She I Born Boats".split()
)


def numbers(text: str) -> set[str]:
    """Numbers as written, with thousands separators removed ("3,000,000" and "3000000" are the same number)."""
    return {match.replace(",", "") for match in _NUMBER.findall(text)}


def names(text: str) -> set[str]:
    """Capitalized words that are names: not a sentence starter, not a word the text also uses in lower case;
    month names count (dates)."""
    lower = set(re.findall(r"\b[a-z]+\b", text))
    found = set()
    for word in _CAPITALIZED.findall(text):
        if word in _MONTHS or (word not in _STARTERS and word.lower() not in lower):
            found.add(word)
    return found


def missing_facts(source: str, rewrite: str) -> list[str]:
    """The source's numbers and names the rewrite lacks (sorted: numbers first, then names)."""
    lost_numbers = sorted(numbers(source) - numbers(rewrite))
    rewrite_words = set(re.findall(r"\b[\w'-]+\b", rewrite))
    lost_names = sorted(name for name in names(source) if name not in rewrite_words)
    return lost_numbers + lost_names


def added_numbers(source: str, rewrite: str) -> list[str]:
    """Numbers of the rewrite the source does not have (invented figures), sorted."""
    return sorted(numbers(rewrite) - numbers(source))


@dataclass(frozen=True)
class ChunkVerdict:
    """A judge's decision on one rewritten chunk: `score` in [0, 1] (higher: more faithful), `reason` why."""

    faithful: bool
    score: float
    reason: str


@runtime_checkable
class ChunkJudge(Protocol):
    """Decides whether a rewritten chunk is faithful to its source chunk."""

    def judge(self, source: str, rewrite: str) -> ChunkVerdict:
        """The verdict on `rewrite` as a rewrite of `source`."""
        ...


class ChecksJudge:
    """The deterministic checks alone: faithful iff no number or name of the source is lost and no number added.
    Score: the share of the source's numbers and names kept (0 when a number was added)."""

    def judge(self, source: str, rewrite: str) -> ChunkVerdict:
        if not rewrite.strip():
            return ChunkVerdict(False, 0.0, "empty rewrite")
        lost, added = missing_facts(source, rewrite), added_numbers(source, rewrite)
        if not lost and not added:
            return ChunkVerdict(True, 1.0, "every number and name kept")
        reasons = ([f"lost {', '.join(lost)}"] if lost else []) + ([f"added {', '.join(added)}"] if added else [])
        total = len(numbers(source)) + len(names(source))
        score = 0.0 if added else 1.0 - len(lost) / max(total, 1)
        return ChunkVerdict(False, round(score, 4), "; ".join(reasons))


_VERDICT = re.compile(r"\b(un|not\s+)?faithful\b", re.IGNORECASE)


def parse_faithfulness(reply: str) -> ChunkVerdict:
    """The first FAITHFUL / UNFAITHFUL (or "not faithful") word of a judge reply (after any `</think>`); no verdict
    word: unfaithful, reason "unparseable judge reply". Read with a regex, never evaluated."""
    text = strip_thinking(reply)
    match = _VERDICT.search(text)
    if match is None:
        return ChunkVerdict(False, 0.0, f"unparseable judge reply: {_excerpt(text)!r}")
    why = _excerpt(text[match.end() :].lstrip(" :.-—\n")) or "no reason given"
    if match.group(1):
        return ChunkVerdict(False, 0.0, f"judge: unfaithful: {why}")
    return ChunkVerdict(True, 1.0, f"judge: faithful: {why}")


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class LLMChunkJudge:
    """The checks, then a judge call through an `LLMClient` (temperature 0); a failed call or an unreadable reply
    is an unfaithful verdict, never an exception."""

    def __init__(self, client: Any, max_tokens: int = 128):
        self.client, self.max_tokens, self.checks = client, max_tokens, ChecksJudge()

    def judge(self, source: str, rewrite: str) -> ChunkVerdict:
        checked = self.checks.judge(source, rewrite)
        if not checked.faithful:
            return checked
        try:
            reply = self.client.chat(judge_messages(source, rewrite), temperature=0.0, max_tokens=self.max_tokens)
        except Exception as err:  # noqa: BLE001 (a judge call that fails is a verdict, not a crash)
            return ChunkVerdict(False, 0.0, f"judge call failed: {type(err).__name__}: {_excerpt(str(err))}")
        return parse_faithfulness(reply if isinstance(reply, str) else "")


class ModelChunkJudge:
    """The checks, then every sentence of the rewrite scored against the source chunk by a trained sentence-level
    faithfulness judge (anything with `supported_probs([(source, sentence), ...]) -> list[float]` and a
    `threshold`): faithful iff every sentence's probability reaches the threshold; score: the lowest one."""

    def __init__(self, trained: Any):
        self.trained, self.checks = trained, ChecksJudge()

    def judge(self, source: str, rewrite: str) -> ChunkVerdict:
        checked = self.checks.judge(source, rewrite)
        if not checked.faithful:
            return checked
        sentences = split_sentences(rewrite)
        probs = [float(p) for p in self.trained.supported_probs([(source, s) for s in sentences])]
        threshold = float(self.trained.threshold)
        score = round(min(probs), 4)
        for sentence, prob in zip(sentences, probs):
            if prob < threshold:
                return ChunkVerdict(False, score, f"unsupported ({prob:.2f} < {threshold:.2f}): {_excerpt(sentence)!r}")
        return ChunkVerdict(True, score, f"every sentence supported (min {score:.2f})")
