"""The judges reject trajectories that break their rubric and keep the ones that meet it."""

from __future__ import annotations

import random

import pytest

from k2post.chat.types import Message
from k2post.synth.domains import build_domains
from k2post.synth.judge import AllJudges, RubricJudge, TrajectoryVerdict, parse_judge_reply
from k2post.synth.roles import MISTAKES, ReferenceAgent, RuleToolSimulator, RuleUser
from k2post.synth.tasks import agent_for, make_tasks
from k2post.synth.trajectory import Trajectory, run_trajectory

DOMAINS = build_domains(["bank", "filesystem", "inventory", "tickets"])


def _tasks():
    return [t for d in DOMAINS.values() for t in make_tasks(d, "train", 8, seed=2, personas=["direct"])]


def _play(task, mistake=None, max_turns=8) -> tuple[Trajectory, dict]:
    domain = DOMAINS[task.domain]
    state = domain.new_state(task.scenario)
    agent = ReferenceAgent(task, random.Random(task.id), 0.0, mistake=mistake)
    traj = run_trajectory(
        agent_for(domain).system_prompt,
        domain.tools(),
        agent,
        RuleUser(task),
        RuleToolSimulator(domain.toolset, state),
        max_turns,
    )
    return traj, state.model_dump(mode="json")


def test_reference_trajectories_are_accepted():
    for task in _tasks():
        assert RubricJudge().judge(task, *_play(task)).accepted, task.id


@pytest.mark.parametrize("mistake", [m for m in MISTAKES if m != "wrong_answer"])
def test_each_mistake_breaks_the_rubric_and_is_rejected(mistake):
    rejected = [RubricJudge().judge(task, *_play(task, mistake)) for task in _tasks()]
    assert all(not v.accepted and v.reasons for v in rejected), [v for v in rejected if v.accepted]


def test_wrong_answer_is_rejected_where_the_rubric_asks_for_facts():
    tasks = [t for t in _tasks() if t.rubric.answer]
    assert tasks
    for task in tasks:
        verdict = RubricJudge().judge(task, *_play(task, "wrong_answer"))
        assert not verdict.accepted and "answer" in verdict.reasons


def test_unfinished_and_role_errors_and_raw_call_tokens_are_rejected():
    task = next(t for t in _tasks() if len(t.scenario.reference_turns) >= 2)
    traj, state = _play(task, max_turns=1)
    assert "unfinished" in RubricJudge().judge(task, traj, state).reasons
    traj, state = _play(task)
    traj.messages[-1] = Message(
        role="assistant", content="<|tool_calls_section_begin|><|tool_call_begin|>functions.x:9"
    )
    assert "malformed_tool_call" in RubricJudge().judge(task, traj, state).reasons
    traj.error = "HTTPError: server down"
    assert RubricJudge().judge(task, traj, state).reasons == ["role_error"]


@pytest.mark.parametrize(
    ("reply", "accepted", "reasons"),
    [
        ('{"accept": true, "reasons": []}', True, []),
        ('Sure! {"accept": false, "reasons": ["wrong amount"]} done', False, ["llm:wrong amount"]),
        ('{"accept": false}', False, ["llm:rejected"]),
        ("ACCEPT", None, None),
        ('{"accept": "yes"}', None, None),
        ('{"accept": true, "reasons": "x"}', None, None),
        ("{broken json", None, None),
        ("__import__('os').system('x')", None, None),
    ],
)
def test_llm_judge_reply_parsing(reply, accepted, reasons):
    verdict = parse_judge_reply(reply)
    if accepted is None:
        assert verdict is None
    else:
        assert verdict.accepted is accepted and verdict.reasons == reasons


def test_all_judges_needs_every_accept():
    class Fixed:
        def __init__(self, verdict):
            self.verdict = verdict

        def judge(self, task, trajectory, state):
            return self.verdict

    yes, no = TrajectoryVerdict(accepted=True, judge="a"), TrajectoryVerdict(accepted=False, reasons=["r"], judge="b")
    assert AllJudges([Fixed(yes), Fixed(yes)]).judge(None, None, {}).accepted
    combined = AllJudges([Fixed(yes), Fixed(no)]).judge(None, None, {})
    assert not combined.accepted and combined.reasons == ["r"] and combined.judge == "a+b"


def test_direct_answers_call_no_tool_and_the_answer_judge_keeps_only_right_ones():
    from k2post.synth.judge import AnswerJudge
    from k2post.synth.tasks import make_tasks

    domain = build_domains(["calculator"])["calculator"]
    tasks = make_tasks(domain, "train", 12, seed=1, personas=["direct"])
    for task in tasks:
        state = domain.new_state(task.scenario)
        agent = ReferenceAgent(task, random.Random(task.id), 0.0, direct=True)
        traj = run_trajectory(
            agent_for(domain).system_prompt,
            domain.tools(),
            agent,
            RuleUser(task),
            RuleToolSimulator(domain.toolset, state),
            4,
        )
        assert not traj.calls and traj.final_answer == task.scenario.reference_answer
        assert AnswerJudge().judge(task, traj, state.model_dump(mode="json")).accepted
        assert (
            not RubricJudge().judge(task, traj, state.model_dump(mode="json")).accepted
        )  # the tool rubric would reject it
        traj.messages[-1] = Message(role="assistant", content="The answer is 1.")
        assert AnswerJudge().judge(task, traj, {}).reasons == ["answer"]
    tool_traj, state = _play_in(domain, tasks[0])
    assert AnswerJudge().judge(tasks[0], tool_traj, state).reasons == ["tool_called"]


def _play_in(domain, task):
    state = domain.new_state(task.scenario)
    agent = ReferenceAgent(task, random.Random(task.id), 0.0)
    traj = run_trajectory(
        agent_for(domain).system_prompt,
        domain.tools(),
        agent,
        RuleUser(task),
        RuleToolSimulator(domain.toolset, state),
        4,
    )
    return traj, state.model_dump(mode="json")
