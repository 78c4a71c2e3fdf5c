"""Held-out evaluation: task draws, episode options, summaries (tables), and a real engine run checked task by task."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from k2post.chat.types import Message
from k2post.envs.base import Reward
from k2post.envs.reward_errors import RewardErrorsExceeded
from k2post.envs.mix import EnvEntryConfig
from k2post.evaluation.config import EvalConfig
from k2post.rollout.agentic import EpisodeOptions
from k2post.evaluation.heldout import draw_tasks, episode_samples, eval_work, mean_accuracy, summarize
from k2post.rl.config import BudgetConfig

REPO = Path(__file__).resolve().parents[3]
CHAIN_SUM = {
    "dataset": "chain_sum",
    "dataset_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
}


@pytest.mark.parametrize("name,config", [("math", {"difficulty": 1}), ("reasoning_gym", CHAIN_SUM), ("tool_use", {})])
def test_draw_tasks_is_seeded_held_out_and_cut_to_n(name, config):
    env = EnvEntryConfig(name=name, config=config).make()
    first, again, other = draw_tasks(env, "test", 10, 1), draw_tasks(env, "test", 10, 1), draw_tasks(env, "test", 10, 2)
    assert len(first) == 10 and [t.id for t in first] == [t.id for t in again]
    assert [t.id for t in first] != [t.id for t in other]
    content = lambda t: (t.messages[-1].content, json.dumps(t.answer, sort_keys=True))  # noqa: E731
    train = {content(t) for t in env.tasks("train", seed=0, n=200)}
    assert not train & {content(t) for t in first}  # held out from the train split


def test_eval_work_ids_budgets_and_seeds():
    env = EnvEntryConfig(name="math").make()
    tasks = {"math": draw_tasks(env, "test", 2, 0)}
    budget = BudgetConfig(default_max_tokens=50, max_tokens={"math": 12})
    greedy = eval_work(tasks, budget, 0.0, 1, 0)
    assert [opts for _, opts in greedy] == [
        EpisodeOptions(id=f"eval/math/{t.id}/0", temperature=0.0, max_tokens=12) for t in tasks["math"]
    ]
    sampled = eval_work(tasks, budget, 1.0, 3, 4)
    assert len(sampled) == 6 and len({opts.seed for _, opts in sampled}) == 3
    assert {opts.id.rsplit("/", 1)[1] for _, opts in sampled} == {"0", "1", "2"}


@dataclass
class _Episode:
    env_name: str
    truncated: bool
    loss_mask: list


@pytest.mark.parametrize(
    "values,truncated,threshold,accuracy,mean",
    [
        ([1.0, 0.0, 1.0, 0.0], [False] * 4, 0.5, 0.5, 0.5),
        ([0.6, 0.4, 0.5, 0.49], [True, False, False, False], 0.5, 0.5, 0.4975),
        ([0.0, 0.0], [True, True], 0.5, 0.0, 0.0),
        ([0.3, 0.3, 0.3], [False] * 3, 0.25, 1.0, 0.3),
    ],
)
def test_summarize_tables(values, truncated, threshold, accuracy, mean):
    episodes = [_Episode("e", t, [0, 1, 1]) for t in truncated]
    rewards = [Reward(value=v, error="boom" if i == 0 else None) for i, v in enumerate(values)]
    out = summarize(episodes, rewards, threshold)["e"]
    assert (
        out["n"] == len(values)
        and out["accuracy"] == pytest.approx(accuracy)
        and out["mean_reward"] == pytest.approx(mean)
    )
    assert out["truncation_rate"] == pytest.approx(sum(truncated) / len(truncated))
    assert out["response_tokens_mean"] == 2 and out["reward_errors"] == 1


def test_summarize_keeps_envs_apart_and_mean_is_unweighted():
    episodes = [
        _Episode("a", False, [1]),
        _Episode("b", False, [1]),
        _Episode("b", False, [1]),
        _Episode("b", False, [1]),
    ]
    out = summarize(episodes, [Reward(value=1.0), Reward(value=0.0), Reward(value=0.0), Reward(value=0.0)], 0.5)
    assert out["a"]["accuracy"] == 1.0 and out["b"]["accuracy"] == 0.0 and mean_accuracy(out) == 0.5


@pytest.mark.parametrize(
    "raw,needle",
    [
        ({"envs": [{"name": "math"}, {"name": "math"}]}, "each environment once"),
        ({"temperature": 0.0, "samples_per_task": 3}, "temperature > 0"),
        ({"budget": {"default_max_tokens": 5000}}, "max_episode_tokens"),
    ],
)
def test_bad_eval_configs(raw, needle):
    with pytest.raises(ValueError, match=needle):
        EvalConfig(**raw)


@pytest.mark.slow
def test_eval_matches_a_direct_greedy_chat_scored_in_process(tiny_qwen2_dir, tmp_path):
    """The report's per-task rewards equal greedy vLLM chat replies scored by the env in this process."""
    from k2post.evaluation.heldout import evaluate
    from k2post.rollout.config import SamplingConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    report_path = tmp_path / "report.json"
    engine_cfg = {"max_model_len": 512, "kv_cache_gib": 0.25, "max_num_seqs": 16}
    cfg = EvalConfig(
        model_path=str(tiny_qwen2_dir),
        envs=[EnvEntryConfig(name="math", config={"difficulty": 1})],
        n=6,
        seed=3,
        budget={"default_max_tokens": 8},
        engine=engine_cfg,
        report_path=str(report_path),
    )
    report = evaluate(cfg)
    assert json.loads(report_path.read_text()) == report
    math = report["envs"]["math"]
    assert math["n"] == 6 and math["reward_errors"] == 0 and math["response_tokens_mean"] <= 8

    env = cfg.envs[0].make()
    tasks = draw_tasks(env, "test", 6, 3)
    engine = VLLMEngine(tiny_qwen2_dir, cfg.engine)
    try:
        turns = engine.chat([t.messages for t in tasks], SamplingConfig(temperature=0.0, max_tokens=8))
    finally:
        engine.close()
    direct = [env.score(t, turn.message.content or "").value for t, turn in zip(tasks, turns)]
    assert math["mean_reward"] == pytest.approx(sum(direct) / 6)
    assert math["truncation_rate"] == pytest.approx(
        sum(turn.generation.finish_reason == "length" for turn in turns) / 6
    )


DEMO_ENVS = {e["name"]: e["config"] for e in yaml.safe_load((REPO / "configs" / "rl_demo.yaml").read_text())["envs"]}


@pytest.mark.parametrize("name", ["math", "reasoning_gym", "tool_use"])
@pytest.mark.parametrize("split", ["dev", "test", "shifted"])
def test_draw_tasks_on_every_held_out_split_of_the_demo_envs(name, split):
    env = EnvEntryConfig(name=name, config=DEMO_ENVS[name]).make()
    drawn = draw_tasks(env, split, 64, 3)
    assert len(drawn) == 64 and [t.id for t in drawn] == [t.id for t in draw_tasks(env, split, 64, 3)]
    assert all(t.id.split("-")[0 if name == "tool_use" else 1 if name == "math" else 2] == split for t in drawn)
    content = lambda t: (t.messages[-1].content, json.dumps(t.answer, sort_keys=True))  # noqa: E731
    train = {content(t) for t in env.tasks("train", seed=3, n=300)}
    assert not train & {content(t) for t in drawn}


def test_draw_tasks_defaults_to_the_test_split():
    env = EnvEntryConfig(name="math", config={"difficulty": 1}).make()
    assert [t.id for t in draw_tasks(env, n=5)] == [t.id for t in draw_tasks(env, "test", 5, 0)]


class InProcessPool:
    """RewardPool stand-in: scores in this process."""

    def __init__(self, **_):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def score_batch(self, items):
        return [EnvEntryConfig(name=i.env, config=i.config).make().score(i.task, i.response) for i in items]


@pytest.fixture
def scripted_engine(monkeypatch):
    """run_episodes answers every task right (`\\boxed{answer}`), or 0 for episode ids starting with one of
    `.wrong_prefixes`; `.calls` records (episodes, envs) of each call. Scoring runs in this process."""
    import k2post.envs.workers as workers
    import k2post.evaluation.heldout as heldout

    state = SimpleNamespace(calls=[], wrong_prefixes=())

    def episodes(cfg, work, env_configs=None):
        state.calls.append((len(work), sorted(env_configs or cfg.env_configs())))
        return [
            SimpleNamespace(
                env_name=name,
                task=task,
                messages=[Message(role="assistant", content=f"\\boxed{{{answer(task, options)}}}")],
                truncated=False,
                loss_mask=[1, 1],
                env_turns=[],
            )
            for (name, task), options in work
        ]

    def answer(task, options):
        return 0 if options.id.startswith(tuple(state.wrong_prefixes)) else task.answer

    monkeypatch.setattr(heldout, "run_episodes", episodes)
    monkeypatch.setattr(workers, "RewardPool", InProcessPool)
    return state


@pytest.mark.parametrize("split", ["test", "dev", "shifted"])
def test_evaluate_reports_its_split(scripted_engine, split):
    import k2post.evaluation.heldout as heldout

    report = heldout.evaluate(
        EvalConfig(envs=[EnvEntryConfig(name="math", config={"difficulty": 1})], n=4, split=split)
    )
    assert report["split"] == split and report["envs"]["math"]["n"] == 4 and report["envs"]["math"]["accuracy"] == 1.0
    assert len(report["samples"]["math"]) == 3 and report["samples"]["math"][0]["reward"] == 1.0


def test_evaluate_splits_runs_every_split_on_one_engine(scripted_engine):
    """Several configs: one run_episodes call (one engine build) over all of them, one report each."""
    import k2post.evaluation.heldout as heldout

    scripted_engine.wrong_prefixes = ("eval-shifted/",)
    math = EnvEntryConfig(name="math", config={"difficulty": 1})
    gym = EnvEntryConfig(name="reasoning_gym", config=DEMO_ENVS["reasoning_gym"])
    cfgs = [EvalConfig(envs=[math, gym], n=3, split="test"), EvalConfig(envs=[math], n=2, split="shifted")]
    test, shifted = heldout.evaluate_splits(cfgs)
    assert scripted_engine.calls == [(8, ["math", "reasoning_gym"])]
    assert test["split"] == "test" and test["envs"]["math"]["n"] == 3 and test["envs"]["reasoning_gym"]["n"] == 3
    assert shifted["split"] == "shifted" and set(shifted["envs"]) == {"math"} and shifted["envs"]["math"]["n"] == 2
    assert test["envs"]["math"]["accuracy"] == 1.0 and shifted["envs"]["math"]["accuracy"] == 0.0  # not mixed up
    assert [s["task"] for s in shifted["samples"]["math"]] == [t.id for t in draw_tasks(math.make(), "shifted", 2, 0)]
    with pytest.raises(ValueError, match="temperature differs between the test and shifted evals"):
        heldout.evaluate_splits([cfgs[0], cfgs[1].model_copy(update={"temperature": 0.5})])


def test_episode_samples_show_the_first_transcripts_of_each_env_without_the_system_prompt():
    def episode(env, task_id, text):
        messages = [
            Message(role="system", content="sys"),
            Message(role="user", content="q"),
            Message(role="assistant", content=text),
        ]
        return SimpleNamespace(env_name=env, task=SimpleNamespace(id=task_id), messages=messages)

    episodes = [episode("a", f"a{i}", f"reply {i}") for i in range(4)] + [episode("b", "b0", "only")]
    out = episode_samples(episodes, [Reward(value=i / 4) for i in range(5)], per_env=2)
    assert [s["task"] for s in out["a"]] == ["a0", "a1"] and [s["task"] for s in out["b"]] == ["b0"]
    assert out["a"][1] == {
        "task": "a1",
        "reward": 0.25,
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "reply 1"}],
    }


def test_eval_config_split_defaults_to_test_and_rejects_unknown_ones():
    assert EvalConfig().split == "test" and EvalConfig(split="shifted").split == "shifted"
    with pytest.raises(ValueError, match="split"):
        EvalConfig(split="holdout")


def test_reports_carry_the_first_error_texts_and_fail_past_the_limit(scripted_engine, monkeypatch):
    import k2post.evaluation.heldout as heldout

    def failing(self, items):
        return [Reward(value=0.0, error=f"ValueError: bad {i % 2}") for i, _ in enumerate(items)]

    monkeypatch.setattr(InProcessPool, "score_batch", failing)
    report = heldout.evaluate(EvalConfig(envs=[EnvEntryConfig(name="math", config={"difficulty": 1})], n=4))
    assert report["reward_error_samples"] == {"math": ["ValueError: bad 0", "ValueError: bad 1"]}
    assert report["envs"]["math"]["reward_errors"] == 4
    with pytest.raises(RewardErrorsExceeded) as raised:
        heldout.check_report_errors(report, 0.5)
    assert str(raised.value).startswith("test split: 4 of 4 rewards failed (100% > --max-reward-error-fraction 0.5)")
    assert "first: math: ValueError: bad 0" in str(raised.value)
    heldout.check_report_errors(report, 1.0)


def test_the_report_lists_every_episode_s_output(scripted_engine):
    import k2post.evaluation.heldout as heldout

    report = heldout.evaluate(EvalConfig(envs=[EnvEntryConfig(name="math", config={"difficulty": 1})], n=5))
    episodes = report["episodes"]
    assert len(episodes) == 5 and [e["task"] for e in episodes] == [s["task"] for s in report["samples"]["math"]] + [
        e["task"] for e in episodes[3:]
    ]
    assert all(e["env"] == "math" and e["reward"] == 1.0 and e["error"] is None for e in episodes)
    assert all(e["response"].startswith("\\boxed{") and e["truncated"] is False for e in episodes)
