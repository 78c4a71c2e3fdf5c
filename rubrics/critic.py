"""The self-critique rubric critic: rank K responses to one prompt by pairwise judge calls.

    critic = Critic(client, CriticConfig(aggregation="bradley_terry"))
    result = critic.score(task.messages, responses, task_rubrics=task_rubrics(task))
    rewards = result.scores                      # one float in [0, 1] per response
    log(critic.metrics(result))                  # critic/calls, critic/unparseable_rate, ...

`client` is any `k2post.llm.client.LLMClient` (`chat(messages, **kw) -> str`). Two optional
extras are used when present:

- `chat_results(list_of_message_lists, **kw) -> list[ChatResult]` (preferred: token usage) or
  `chat_batch(list_of_message_lists, **kw) -> list[str | ChatResult]`: every judge prompt of
  one `score` / `score_batch` call goes out in ONE batch (`k2post.llm.EngineLLMClient`, the
  policy's in-process vLLM engine, has both);
- `chat_result(messages, **kw) -> ChatResult` (`.message.content`, `.usage`): used instead of
  `chat` so prompt / completion tokens are counted. Plain `chat` replies count 0 tokens and
  the result says `tokens_counted=False`.

How a prompt is scored:

1. pairs: every unordered pair (`pairs="all"`) or `pairs_per_prompt` distinct pairs drawn with
   the critic's seeded RNG (`pairs="sampled"`);
2. each pair is judged as (A=i, B=j) and, with `both_orders`, also as (A=j, B=i). Both orders
   agree → that winner (s = 1 or 0); they disagree, or either is a tie / unparseable / an
   error → tie (s = 0.5). With `both_orders=False` each pair is judged once, in an order
   drawn from the RNG, so position bias becomes noise instead of favouring low indices;
3. pairwise outcomes → `pairwise` scores in [0, 1] by `aggregation` (`k2post_rubrics.aggregate`);
   a response that played no game (sampled mode) gets 0.5 (win_rate; about 0.5 under BT);
4. `scores = clip(pairwise - penalty, 0, 1)` where `penalty` is the prescriptive detectors'
   total (`k2post_rubrics.detectors`). K = 1 → score 0.5 (minus its penalty), no calls.

A client call that raises, or a batch that fails, never stops the run: those comparisons are
ties and are counted in `errors`. Unparseable replies are ties counted in `unparseable`.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator

from k2post.chat.types import Message
from k2post.config.base import K2Config
from k2post_rubrics.aggregate import Outcome, scores_from
from k2post_rubrics.detectors import PrescriptiveConfig, prescriptive_penalty
from k2post.judging.prompts import judge_messages
from k2post_rubrics.schema import Rubric, builtin_rubrics
from k2post.judging.verdict import PairVerdict, parse_verdict

_ERROR = PairVerdict(None, False, "error")


class CriticConfig(K2Config):
    """How the critic pairs, judges and aggregates K responses to one prompt."""

    pairs: Literal["all", "sampled"] = Field(
        "all", description="'all': every unordered pair; 'sampled': pairs_per_prompt random pairs."
    )
    pairs_per_prompt: int = Field(
        4, description="Sampled mode: distinct unordered pairs judged per prompt (capped at K(K-1)/2)."
    )
    both_orders: bool = Field(
        True, description="Judge each pair as (A=i, B=j) and (A=j, B=i); disagreement counts as a tie."
    )
    aggregation: Literal["win_rate", "bradley_terry"] = Field(
        "win_rate", description="How pairwise outcomes become scores in [0, 1]."
    )
    bt_prior: float = Field(0.5, gt=0.0, description="Bradley–Terry: tied pseudo-games vs a virtual average opponent.")
    rubric_kinds: list[Literal["core", "prescriptive"]] = Field(
        default_factory=lambda: ["core", "prescriptive"],
        description="Shipped rubric kinds shown to the judge; task rubrics passed to score() are always added.",
    )
    prescriptive: PrescriptiveConfig = Field(
        default_factory=PrescriptiveConfig, description="Deterministic prescriptive detectors and their penalties."
    )
    max_tokens: int = Field(64, ge=1, description="Judge reply budget in tokens.")
    temperature: float = Field(0.0, ge=0.0, description="Judge sampling temperature.")
    max_response_chars: int = Field(
        6000, ge=200, description="Longer prompt messages / responses keep head and tail in the judge prompt."
    )
    seed: int = Field(0, description="Seed of the RNG that samples pairs and single-order orientations.")

    @field_validator("pairs_per_prompt")
    @classmethod
    def _check_pairs_per_prompt(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"pairs_per_prompt must be >= 1 (got {value}); use pairs='all' to judge every pair")
        return value

    @field_validator("rubric_kinds")
    @classmethod
    def _check_kinds(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"rubric_kinds {value} repeats a kind: list each of core, prescriptive once")
        return value


@dataclass
class CriticResult:
    """Scores of K responses plus the bookkeeping behind them.

    `scores[k] = clip(pairwise[k] - penalties[k], 0, 1)`; `detector_hits[k]` maps a
    prescriptive detector to the phrase it matched. Counters are per judge call: `calls`,
    tokens (0 unless the client reports usage: `tokens_counted`), `unparseable` (replies with
    no readable verdict), `ties` (parsed ties), `errors` (calls that raised),
    `position_a_wins` / `position_b_wins` (decisive verdicts by position). Per pair:
    `order_disagreements` (both orders decisive, opposite winners), `comparisons`
    `(i, j, verdict with A=i, verdict with A=j or None)` and `outcomes` `(i, j, s)`.
    """

    scores: list[float]
    pairwise: list[float]
    penalties: list[float]
    detector_hits: list[dict[str, str]]
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_counted: bool = False
    unparseable: int = 0
    ties: int = 0
    errors: int = 0
    position_a_wins: int = 0
    position_b_wins: int = 0
    order_disagreements: int = 0
    comparisons: list[tuple[int, int, PairVerdict, PairVerdict | None]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)


@dataclass(frozen=True)
class _Job:
    """One judge call: which prompt group, and which responses sit at A and B."""

    group: int
    a: int
    b: int
    messages: list[Message]


@dataclass
class _Reply:
    """A judge reply (None on error) and its token usage."""

    text: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    has_usage: bool = False


def _as_reply(raw: Any) -> _Reply:
    """A `_Reply` from a plain string or a ChatResult-like object (`.message.content`, `.usage`)."""
    if isinstance(raw, str):
        return _Reply(raw)
    message = getattr(raw, "message", None)
    usage = getattr(raw, "usage", None) or {}
    text = getattr(message, "content", None)
    return _Reply(
        text if isinstance(text, str) else None,
        int(usage.get("prompt_tokens", 0) or 0),
        int(usage.get("completion_tokens", 0) or 0),
        has_usage=bool(usage),
    )


class Critic:
    """Ranks K responses by pairwise judge calls under rubrics (see the module docstring)."""

    def __init__(self, client: Any, cfg: CriticConfig | None = None) -> None:
        if not callable(getattr(client, "chat", None)):
            raise TypeError(f"{type(client).__name__} has no chat(messages, **kw) method: it is not an LLMClient")
        self.client = client
        self.cfg = cfg or CriticConfig()
        self.rubrics: list[Rubric] = builtin_rubrics(self.cfg.rubric_kinds)
        self._rng = random.Random(self.cfg.seed)

    @property
    def _use_chat_result(self) -> bool:
        """Call chat_result (token usage) one by one: the client has it and no chat_batch."""
        has_batch = callable(getattr(self.client, "chat_batch", None)) or callable(
            getattr(self.client, "chat_results", None)
        )
        return not has_batch and callable(getattr(self.client, "chat_result", None))

    def score(
        self,
        prompt_messages: Sequence[Message],
        responses: Sequence[str],
        task_rubrics: Sequence[Rubric] | None = None,
    ) -> CriticResult:
        """Score K responses to one prompt (see the module docstring)."""
        return self.score_batch([(prompt_messages, responses, task_rubrics)])[0]

    def score_batch(
        self, items: Sequence[tuple[Sequence[Message], Sequence[str], Sequence[Rubric] | None]]
    ) -> list[CriticResult]:
        """Score several prompts; with `chat_batch` all their judge calls go in one batch."""
        jobs = [job for group, item in enumerate(items) for job in self._plan(group, *item)]
        replies = self._run(jobs)
        results = []
        for group, (_prompt, responses, _rubrics) in enumerate(items):
            mine = [(job, reply) for job, reply in zip(jobs, replies) if job.group == group]
            results.append(self._finish(list(responses), mine))
        return results

    def _pairs(self, k: int) -> list[tuple[int, int]]:
        """Unordered pairs (i < j) to judge for K responses."""
        every = list(itertools.combinations(range(k), 2))
        if self.cfg.pairs == "all" or self.cfg.pairs_per_prompt >= len(every):
            return every
        return sorted(self._rng.sample(every, self.cfg.pairs_per_prompt))

    def _plan(
        self, group: int, prompt: Sequence[Message], responses: Sequence[str], extra: Sequence[Rubric] | None
    ) -> list[_Job]:
        """The judge calls of one prompt: one or two orders per pair."""
        rubrics = self.rubrics + list(extra or [])
        orders: list[tuple[int, int]] = []
        for i, j in self._pairs(len(responses)):
            if self.cfg.both_orders:
                orders += [(i, j), (j, i)]
            else:
                orders.append((i, j) if self._rng.random() < 0.5 else (j, i))
        return [
            _Job(group, a, b, judge_messages(prompt, responses[a], responses[b], rubrics, self.cfg.max_response_chars))
            for a, b in orders
        ]

    def _run(self, jobs: list[_Job]) -> list[_Reply]:
        """Send the judge calls: one batch when the client has chat_batch, else one by one."""
        if not jobs:
            return []
        kw = {"max_tokens": self.cfg.max_tokens, "temperature": self.cfg.temperature}
        batch = getattr(self.client, "chat_results", None) or getattr(self.client, "chat_batch", None)
        if callable(batch):
            try:
                raw = list(batch([job.messages for job in jobs], **kw))
            except Exception:  # noqa: BLE001 - a failing judge must not stop the run
                return [_Reply(None) for _ in jobs]
            if len(raw) != len(jobs):
                return [_Reply(None) for _ in jobs]
            return [_as_reply(item) for item in raw]
        return [self._call_one(job.messages, kw) for job in jobs]

    def _call_one(self, messages: list[Message], kw: dict[str, Any]) -> _Reply:
        """One judge call; an exception becomes a `_Reply(None)` (counted as an error)."""
        try:
            if self._use_chat_result:
                return _as_reply(self.client.chat_result(messages, **kw))
            return _as_reply(self.client.chat(messages, **kw))
        except Exception:  # noqa: BLE001 - a failing judge must not stop the run
            return _Reply(None)

    def _finish(self, responses: list[str], done: list[tuple[_Job, _Reply]]) -> CriticResult:
        """Verdicts → outcomes → aggregated scores minus prescriptive penalties."""
        penalties, hits = [], []
        for response in responses:
            penalty, found = prescriptive_penalty(response, self.cfg.prescriptive)
            penalties.append(penalty)
            hits.append(found)
        result = CriticResult(scores=[], pairwise=[], penalties=penalties, detector_hits=hits)
        result.tokens_counted = any(reply.has_usage for _job, reply in done)
        verdicts = {(job.a, job.b): self._tally(result, reply) for job, reply in done}
        self._combine(result, verdicts)
        result.pairwise = scores_from(self.cfg.aggregation, len(responses), result.outcomes, prior=self.cfg.bt_prior)
        result.scores = [min(1.0, max(0.0, s - p)) for s, p in zip(result.pairwise, penalties)]
        return result

    @staticmethod
    def _tally(result: CriticResult, reply: _Reply) -> PairVerdict:
        """Parse one reply and update the per-call counters."""
        result.calls += 1
        result.prompt_tokens += reply.prompt_tokens
        result.completion_tokens += reply.completion_tokens
        if reply.text is None:
            result.errors += 1
            return _ERROR
        verdict = parse_verdict(reply.text)
        result.unparseable += not verdict.parsed
        result.ties += verdict.is_tie
        result.position_a_wins += verdict.winner == "A"
        result.position_b_wins += verdict.winner == "B"
        return verdict

    @staticmethod
    def _combine(result: CriticResult, verdicts: dict[tuple[int, int], PairVerdict]) -> None:
        """Pairwise outcomes (i, j, s) from the verdicts of one or both orders of each pair."""
        for (a, b), first in verdicts.items():
            if (b, a) in verdicts and b < a:
                continue  # handled with its mirror, whose A index is the smaller one
            second = verdicts.get((b, a))
            s_first = _score_for_first(first, a_is_i=True)
            if second is None:
                result.comparisons.append((a, b, first, None))
                result.outcomes.append((a, b, 0.5 if s_first is None else s_first))
                continue
            s_second = _score_for_first(second, a_is_i=False)
            agree = s_first is not None and s_first == s_second and s_first != 0.5
            result.order_disagreements += {s_first, s_second} == {0.0, 1.0}
            result.comparisons.append((a, b, first, second))
            result.outcomes.append((a, b, s_first if agree else 0.5))

    @staticmethod
    def metrics(results: CriticResult | Sequence[CriticResult]) -> dict[str, float]:
        """Counters of one or several results as `critic/...` floats for the metrics log."""
        many = [results] if isinstance(results, CriticResult) else list(results)
        total = {name: sum(getattr(r, name) for r in many) for name in _COUNTERS}
        calls = total["calls"]
        decisive = total["position_a_wins"] + total["position_b_wins"]
        pairs = sum(1 for r in many for comparison in r.comparisons if comparison[3] is not None)
        return {
            "critic/calls": float(calls),
            "critic/prompt_tokens": float(total["prompt_tokens"]),
            "critic/completion_tokens": float(total["completion_tokens"]),
            "critic/tokens": float(total["prompt_tokens"] + total["completion_tokens"]),
            "critic/unparseable_rate": total["unparseable"] / calls if calls else 0.0,
            "critic/tie_rate": total["ties"] / calls if calls else 0.0,
            "critic/error_rate": total["errors"] / calls if calls else 0.0,
            "critic/position_a_rate": total["position_a_wins"] / decisive if decisive else 0.5,
            "critic/order_disagreement_rate": total["order_disagreements"] / pairs if pairs else 0.0,
            "critic/penalty_mean": _mean([p for r in many for p in r.penalties]),
            "critic/score_mean": _mean([s for r in many for s in r.scores]),
        }


_COUNTERS = (
    "calls",
    "prompt_tokens",
    "completion_tokens",
    "unparseable",
    "ties",
    "errors",
    "position_a_wins",
    "position_b_wins",
    "order_disagreements",
)


def _mean(values: list[float]) -> float:
    """Mean, 0.0 for no values."""
    return sum(values) / len(values) if values else 0.0


def _score_for_first(verdict: PairVerdict, a_is_i: bool) -> float | None:
    """s for the pair's first index i: 1 if i won, 0 if it lost, 0.5 tie; None if unreadable."""
    if not verdict.parsed:
        return None
    if verdict.winner is None:
        return 0.5
    i_won = (verdict.winner == "A") == a_is_i
    return 1.0 if i_won else 0.0
