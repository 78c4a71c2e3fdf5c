"""`SynthTaskEnv`: synthesis tasks as a multi-turn environment scored by the rubric judge."""

from __future__ import annotations

import random

from k2post.chat.types import Message
from k2post.synth.domains import build_domains
from k2post.synth.evaluate import SynthTaskEnv
from k2post.synth.roles import ReferenceAgent
from k2post.synth.tasks import make_tasks


def _play(env: SynthTaskEnv, synth_task, mistake=None) -> float:
    task = env.as_task(synth_task)
    state = env.reset(task)
    agent = ReferenceAgent(synth_task, random.Random(0), 0.0, mistake=mistake)
    messages = list(task.messages)
    for _ in range(8):
        turn = agent.next_turn(messages, env.tools_for(task))
        messages.append(turn)
        result = env.step(state, turn)
        messages += result.observations
        if result.done:
            break
    return env.score_state(task, state).value


def test_reference_solves_and_mistakes_fail():
    domains = build_domains(["bank", "recipes"])
    tasks = [t for d in domains.values() for t in make_tasks(d, "test", 6, seed=0, personas=["busy"])]
    env = SynthTaskEnv(tasks, domains)
    assert [_play(env, t) for t in tasks] == [1.0] * len(tasks)
    assert all(_play(env, t, "skip_call") == 0.0 for t in tasks)
    first = env.as_task(tasks[0])
    assert first.messages[1].content.startswith("quick one: ") and env.tools_for(first)
    assert len(list(env.tasks("test"))) == len(tasks) and list(env.tasks("train")) == []


def test_single_text_answer_without_calls_scores_zero():
    domain = build_domains(["inventory"])
    synth = make_tasks(domain["inventory"], "test", 1, seed=3, personas=["direct"])[0]
    env = SynthTaskEnv([synth], domain)
    reward = env.score(env.as_task(synth), "I did it.")
    assert reward.value == 0.0 and reward.info["reasons"]
    assert env.step(env.reset(env.as_task(synth)), Message(role="assistant", content="x")).done
