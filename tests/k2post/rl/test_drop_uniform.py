"""loss.drop_uniform_groups: the controller forgets ready groups whose shaped rewards are all equal (no engines)."""

from __future__ import annotations

from k2post.rl import batch as rb
from k2post.rl.controller import RLRun
from k2post.config.registry import load_run_config


def _group(group_id: str, rewards: list[float], truncated: list[bool] | None = None) -> list[rb.Sample]:
    truncated = truncated or [False] * len(rewards)
    return [
        rb.Sample(group_id, i, "math", "math", f"t-{group_id}", [1, 2, 3], [0, 1, 1], r, t, "env_done")
        for i, (r, t) in enumerate(zip(rewards, truncated))
    ]


def test_book_discard_keeps_order():
    book = rb.GroupBook(k=2)
    book.ready = [_group("a", [1, 1]), _group("b", [0, 1]), _group("c", [0, 0])]
    assert book.discard(lambda g: g[0].group_id != "a") == 1
    assert [g[0].group_id for g in book.ready] == ["b", "c"]


def test_uniform_groups_are_dropped_after_shaping_and_counted():
    cfg = load_run_config(
        "configs/rl_demo.yaml", ["rollout.samples_per_prompt=2", "loss.drop_uniform_groups=true"], expected_kind="rl"
    )
    run = RLRun(cfg)
    # budget penalty `replace` (0.0) turns the truncated 1.0 into 0.0: group "d" has signal only after shaping
    run.state.book.ready = [
        _group("a", [1, 1]),
        _group("b", [0, 1]),
        _group("c", [0.5, 0.5]),
        _group("d", [1, 1], [False, True]),
    ]
    row = run._drop_uniform(iteration=0)
    assert [g[0].group_id for g in run.state.book.ready] == ["b", "d"]
    assert row["train/dropped_uniform_groups"] == 2
    assert row["rollout/groups_nonzero_adv_frac"] == 0.5  # measured on the groups before the drop
