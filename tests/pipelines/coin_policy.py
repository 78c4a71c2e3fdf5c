"""A policy whose groups have mixed rewards: tiny-qwen2 trained briefly on two replies to lowercase-constraint
prompts, one that passes and one that fails, so it samples either (an untrained model's groups are all-pass or
all-fail, and nothing would be harvested for the critic). The fixture `coin_policy_dir` (tests/pipelines/conftest.py)
builds it once per session."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# require_answer off: the two fixed replies answer no request; only the lowercase rule decides their reward
IF_CONFIG = {
    "max_constraints": 1,
    "constraint_kinds": ["lowercase"],
    "test_size": 8,
    "dev_size": 8,
    "require_answer": False,
}
REPLIES = ["all in lowercase here.", "Not In Lowercase Here."]  # the policy says either, about half the time each


def train_coin_policy(tiny_qwen2_dir: Path, out: Path) -> Path:
    """Train the coin policy into `out` (40 steps, one torch thread)."""
    import torch

    import k2post_environments  # noqa: F401  (registers the gyms)
    from k2post.chat.template import render_ids
    from k2post.chat.types import Message
    from k2post.envs.registry import make_environment
    from k2post.models.loading import load_tokenizer

    sys.path.insert(0, str(REPO / "tests" / "k2post" / "rollout"))
    from tool_model import Trajectory, train_on

    env, tokenizer = make_environment("instruction_following", IF_CONFIG), load_tokenizer(tiny_qwen2_dir)
    trajectories = []
    for task in itertools.islice(env.tasks("train", seed=0), 4):
        for reply in REPLIES:
            rendered = render_ids(tokenizer, [*task.messages, Message(role="assistant", content=reply)])
            trajectories.append(Trajectory(task, rendered.input_ids, rendered.assistant_mask, []))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's ops gain nothing from 2 threads, and lose 10x when the cores are busy
    try:
        train_on(tiny_qwen2_dir, out, trajectories, max_steps=40)
    finally:
        torch.set_num_threads(threads)
    return out
