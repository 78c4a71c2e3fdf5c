"""Critic end to end with scripted judge clients (no model): bias, preference, junk, batching."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from k2post.chat.types import Message
from k2post.llm.client import ChatResult, LLMClient
from k2post_rubrics.critic import Critic, CriticConfig, CriticResult
from k2post_rubrics.detectors import PrescriptiveConfig
from k2post_rubrics.schema import Rubric

PROMPT = [Message(role="user", content="Explain recursion.")]
RESPONSES = ["a", "bbbb", "cc", "ddddddd"]  # lengths 1, 4, 2, 7 → by length: 3 > 1 > 2 > 0
AGGREGATIONS = ["win_rate", "bradley_terry"]


def _response(messages: list[Message], position: str) -> str:
    match = re.search(rf"<response_{position}>\n(.*?)\n</response_{position}>", messages[-1].content, re.DOTALL)
    assert match is not None
    return match.group(1)


class Scripted:
    """Answers every judge prompt with `reply(messages)`; records the calls and kwargs."""

    def __init__(self, reply):
        self.reply = reply
        self.calls: list[list[Message]] = []
        self.kwargs: list[dict[str, Any]] = []

    def chat(self, messages: list[Message], **kw: Any) -> str:
        self.calls.append(messages)
        self.kwargs.append(kw)
        return self.reply(messages)


def always_a(messages):
    return "Looks fine.\n[[A]]"


def prefers_longer(messages):
    a, b = len(_response(messages, "a")), len(_response(messages, "b"))
    return "[[A]]" if a > b else "[[B]]" if b > a else "[[TIE]]"


class Batched(Scripted):
    """Has chat_batch too: all prompts of a score call must arrive in one batch."""

    def __init__(self, reply):
        super().__init__(reply)
        self.batches: list[int] = []

    def chat(self, messages, **kw):  # pragma: no cover - must not be used
        raise AssertionError("chat() called although chat_batch exists")

    def chat_batch(self, batch: list[list[Message]], **kw: Any) -> list[str]:
        self.batches.append(len(batch))
        return [self.reply(messages) for messages in batch]


class WithUsage(Scripted):
    """Has chat_result with token usage."""

    def chat_result(self, messages, tools=None, **kw):
        self.calls.append(messages)
        text = self.reply(messages)
        usage = {"prompt_tokens": 100, "completion_tokens": 5}
        return ChatResult(message=Message(role="assistant", content=text), usage=usage)


def _critic(client, **cfg) -> Critic:
    return Critic(client, CriticConfig(**cfg))


def _strictly_descending(values, order):
    ranked = [values[i] for i in order]
    return all(a > b for a, b in zip(ranked, ranked[1:]))


def test_scripted_clients_are_llm_clients():
    assert isinstance(Scripted(always_a), LLMClient)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_pure_position_bias_cancels_with_both_orders(aggregation):
    result = _critic(Scripted(always_a), aggregation=aggregation).score(PROMPT, RESPONSES)
    assert result.scores == pytest.approx([0.5] * 4)
    assert result.calls == 12 and result.position_a_wins == 12
    assert result.order_disagreements == 6
    assert all(s == 0.5 for _i, _j, s in result.outcomes)
    assert Critic.metrics(result)["critic/position_a_rate"] == 1.0


def test_pure_position_bias_shows_with_one_order():
    result = _critic(Scripted(always_a), both_orders=False).score(PROMPT, RESPONSES)
    assert result.calls == 6
    for i, j, verdict, second in result.comparisons:
        assert second is None and verdict.winner == "A"
    assert sorted(result.outcomes) == sorted((i, j, 1.0) for i, j, _v, _s in result.comparisons)
    wins = [sum(1 for i, _j, _v, _s in result.comparisons if i == k) for k in range(4)]
    assert result.pairwise == pytest.approx([w / 3 for w in wins])


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("both_orders", [True, False])
def test_length_preferring_judge_orders_by_length(aggregation, both_orders):
    result = _critic(Scripted(prefers_longer), aggregation=aggregation, both_orders=both_orders).score(
        PROMPT, RESPONSES
    )
    assert _strictly_descending(result.scores, [3, 1, 2, 0])
    assert result.scores == result.pairwise and result.penalties == [0.0] * 4
    assert result.unparseable == result.errors == result.ties == 0
    if aggregation == "win_rate":
        assert result.scores == pytest.approx([0.0, 2 / 3, 1 / 3, 1.0])


@pytest.mark.parametrize("junk", ["", "I refuse.", "[[A]] [[B]]", "{not json", "\x00" * 50])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_junk_replies_are_unparseable_ties(junk, aggregation):
    result = _critic(Scripted(lambda m: junk), aggregation=aggregation).score(PROMPT, RESPONSES)
    assert result.unparseable == result.calls == 12
    assert result.scores == pytest.approx([0.5] * 4)
    metrics = Critic.metrics(result)
    assert metrics["critic/unparseable_rate"] == 1.0 and metrics["critic/tie_rate"] == 0.0


def test_ties_are_counted():
    result = _critic(Scripted(lambda m: "[[TIE]]")).score(PROMPT, RESPONSES)
    assert result.ties == 12 and result.unparseable == 0
    assert Critic.metrics(result)["critic/tie_rate"] == 1.0


@pytest.mark.parametrize(("k", "pairs_per_prompt", "calls"), [(4, 2, 4), (6, 3, 6), (4, 6, 12), (4, 50, 12), (2, 1, 2)])
def test_sampled_pairs_call_count(k, pairs_per_prompt, calls):
    client = Scripted(prefers_longer)
    result = _critic(client, pairs="sampled", pairs_per_prompt=pairs_per_prompt).score(
        PROMPT, ["x" * (n + 1) for n in range(k)]
    )
    assert result.calls == len(client.calls) == calls
    pairs = {(min(i, j), max(i, j)) for i, j, _a, _b in result.comparisons}
    assert len(pairs) == calls // 2


def _sampled_pairs(seed: int, prompts: int = 3):
    critic = _critic(Scripted(prefers_longer), pairs="sampled", pairs_per_prompt=3, seed=seed)
    return [[(i, j) for i, j, _a, _b in critic.score(PROMPT, ["r"] * 8).comparisons] for _ in range(prompts)]


def test_sampled_pairs_are_deterministic_per_seed():
    assert _sampled_pairs(1) == _sampled_pairs(1)
    assert _sampled_pairs(1) != _sampled_pairs(2)
    first_prompts = _sampled_pairs(1)
    assert first_prompts[0] != first_prompts[1]  # the RNG moves on between prompts


def test_sampled_unplayed_response_gets_half():
    result = _critic(Scripted(prefers_longer), pairs="sampled", pairs_per_prompt=1).score(PROMPT, ["a", "bb", "ccc"])
    played = {index for i, j, _a, _b in result.comparisons for index in (i, j)}
    (unplayed,) = {0, 1, 2} - played
    assert result.pairwise[unplayed] == 0.5


@pytest.mark.parametrize(("k", "calls"), [(2, 2), (3, 6), (4, 12), (5, 20)])
def test_all_pairs_call_count(k, calls):
    result = _critic(Scripted(always_a)).score(PROMPT, ["r"] * k)
    assert result.calls == calls == k * (k - 1)


@pytest.mark.parametrize("responses", [["only one"], []])
def test_fewer_than_two_responses_make_no_calls(responses):
    client = Scripted(always_a)
    result = _critic(client).score(PROMPT, responses)
    assert client.calls == [] and result.calls == 0
    assert result.scores == [0.5] * len(responses)


def test_single_response_still_pays_its_penalty():
    result = _critic(Scripted(always_a)).score(PROMPT, ["Great question! Yes."])
    assert result.scores == [0.0] and result.pairwise == [0.5]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_prescriptive_penalty_lowers_praise_even_when_judge_ties(aggregation):
    responses = ["Great question! Recursion is a function calling itself.", "Recursion is a function calling itself."]
    result = _critic(Scripted(lambda m: "[[TIE]]"), aggregation=aggregation).score(PROMPT, responses)
    assert result.pairwise == pytest.approx([0.5, 0.5])
    assert result.penalties == [0.5, 0.0]
    assert result.scores[0] < result.scores[1]
    assert result.detector_hits == [{"initial_praise": "great question"}, {}]


def test_scores_are_clipped_to_unit_interval():
    responses = ["Great question! This answer is accurate.", "Plain."]
    result = _critic(Scripted(prefers_longer)).score(PROMPT, responses)
    assert result.pairwise[0] == 1.0 and result.penalties[0] == 1.0
    assert result.scores == [0.0, 0.0]


def test_penalties_follow_config():
    cfg = {"prescriptive": PrescriptiveConfig(initial_praise=False)}
    result = _critic(Scripted(lambda m: "[[TIE]]"), **cfg).score(PROMPT, ["Great question! Yes.", "Yes."])
    assert result.penalties == [0.0, 0.0] and result.scores == [0.5, 0.5]


class Flaky(Scripted):
    """Raises on every `fail_every`-th call."""

    def __init__(self, reply, fail_every: int):
        super().__init__(reply)
        self.fail_every = fail_every

    def chat(self, messages, **kw):
        if (len(self.calls) + 1) % self.fail_every == 0:
            self.calls.append(messages)
            raise ConnectionError("judge down")
        return super().chat(messages, **kw)


def test_raising_client_gives_ties_and_errors():
    result = _critic(Flaky(always_a, fail_every=1)).score(PROMPT, RESPONSES)
    assert result.errors == result.calls == 12
    assert result.unparseable == 0 and result.scores == [0.5] * 4
    assert Critic.metrics(result)["critic/error_rate"] == 1.0


def test_partly_failing_client_keeps_the_rest():
    result = _critic(Flaky(prefers_longer, fail_every=3), both_orders=False).score(PROMPT, RESPONSES)
    assert result.errors == 2 and result.calls == 6
    assert sum(s == 0.5 for _i, _j, s in result.outcomes) == 2


def test_chat_batch_is_used_once_per_call():
    client = Batched(prefers_longer)
    result = _critic(client).score(PROMPT, RESPONSES)
    assert client.batches == [12]
    assert _strictly_descending(result.scores, [3, 1, 2, 0])
    assert result.tokens_counted is False and result.prompt_tokens == 0


def test_score_batch_sends_every_prompt_in_one_batch():
    client = Batched(prefers_longer)
    results = _critic(client).score_batch(
        [(PROMPT, RESPONSES, None), (PROMPT, ["x", "yy"], None), (PROMPT, ["z"], None)]
    )
    assert client.batches == [12 + 2]
    assert [r.calls for r in results] == [12, 2, 0]
    assert results[1].scores == [0.0, 1.0] and results[2].scores == [0.5]


@pytest.mark.parametrize(
    "batch",
    [
        lambda prompts, **kw: (_ for _ in ()).throw(RuntimeError("engine died")),
        lambda prompts, **kw: ["[[A]]"],  # wrong length
    ],
)
def test_failing_batch_gives_ties(batch):
    client = Batched(always_a)
    client.chat_batch = batch
    result = _critic(client).score(PROMPT, RESPONSES)
    assert result.errors == 12 and result.scores == [0.5] * 4


def test_batch_may_return_chat_results_with_usage():
    client = Batched(prefers_longer)
    client.chat_batch = lambda prompts, **kw: [
        ChatResult(
            message=Message(role="assistant", content=prefers_longer(m)),
            usage={"prompt_tokens": 7, "completion_tokens": 1},
        )
        for m in prompts
    ]
    result = _critic(client).score(PROMPT, RESPONSES)
    assert result.tokens_counted and result.prompt_tokens == 84 and result.completion_tokens == 12


def test_chat_result_counts_tokens():
    client = WithUsage(prefers_longer)
    result = _critic(client).score(PROMPT, RESPONSES)
    assert result.tokens_counted is True
    assert (result.prompt_tokens, result.completion_tokens) == (1200, 60)
    metrics = Critic.metrics(result)
    assert metrics["critic/tokens"] == 1260.0 and metrics["critic/calls"] == 12.0


def test_plain_chat_counts_no_tokens():
    result = _critic(Scripted(always_a)).score(PROMPT, RESPONSES)
    assert result.tokens_counted is False and result.prompt_tokens == result.completion_tokens == 0


def test_sampling_options_are_passed():
    client = Scripted(always_a)
    _critic(client, max_tokens=32, temperature=0.7).score(PROMPT, ["x", "y"])
    assert client.kwargs == [{"max_tokens": 32, "temperature": 0.7}] * 2


def test_task_rubrics_reach_the_judge_prompt():
    client = Scripted(always_a)
    rubric = Rubric(name="seine", kind="task", title="Mentions the Seine", text="Names the river.")
    _critic(client).score(PROMPT, ["x", "y"], task_rubrics=[rubric])
    assert all("Mentions the Seine: Names the river." in m[-1].content for m in client.calls)
    assert all("No initial praise" in m[-1].content for m in client.calls)


def test_rubric_kinds_select_shipped_rubrics():
    critic = _critic(Scripted(always_a), rubric_kinds=["core"])
    assert {r.kind for r in critic.rubrics} == {"core"}


def test_metrics_of_several_results_and_keys():
    critic = _critic(Scripted(always_a))
    results = [critic.score(PROMPT, RESPONSES), critic.score(PROMPT, ["x", "y"])]
    metrics = Critic.metrics(results)
    assert metrics["critic/calls"] == 14.0
    assert set(metrics) >= {
        "critic/calls",
        "critic/tokens",
        "critic/unparseable_rate",
        "critic/tie_rate",
        "critic/position_a_rate",
        "critic/error_rate",
        "critic/order_disagreement_rate",
    }
    assert metrics["critic/order_disagreement_rate"] == 1.0
    assert all(isinstance(v, float) for v in metrics.values())
    empty = Critic.metrics(CriticResult(scores=[], pairwise=[], penalties=[], detector_hits=[]))
    assert empty["critic/unparseable_rate"] == 0.0 and empty["critic/position_a_rate"] == 0.5


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"pairs_per_prompt": 0}, "pairs_per_prompt must be >= 1"),
        ({"rubric_kinds": ["core", "core"]}, "repeats a kind"),
        ({"rubric_kinds": ["task"]}, "rubric_kinds"),
        ({"aggregation": "elo"}, "aggregation"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"bt_prior": 0}, "bt_prior"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_config_validation(cfg, match):
    with pytest.raises(ValidationError, match=match):
        CriticConfig(**cfg)


def test_config_defaults():
    cfg = CriticConfig()
    assert (cfg.pairs, cfg.both_orders, cfg.aggregation, cfg.temperature) == ("all", True, "win_rate", 0.0)
    assert cfg.rubric_kinds == ["core", "prescriptive"] and cfg.max_tokens == 64


def test_not_a_client():
    with pytest.raises(TypeError, match="no chat"):
        Critic(object())
