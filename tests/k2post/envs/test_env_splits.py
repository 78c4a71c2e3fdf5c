"""Splits (k2post.envs.splits): the hash/every-k helpers, and every built-in environment's train/dev/test/shifted
contract on the environments without a shift: dev is accepted, fixed and disjoint, shifted is a one-line error."""

from __future__ import annotations

import pytest

from k2post.envs import make_environment
from k2post.envs.splits import SPLITS, check_split, every_split, hash_split, split_of_bucket, unsupported_split


@pytest.mark.parametrize(
    "bucket,expected", [(0.0, "test"), (0.19, "test"), (0.2, "dev"), (0.29, "dev"), (0.31, "train"), (0.99, "train")]
)
def test_split_of_bucket_table(bucket, expected):
    assert split_of_bucket(bucket, 0.2, 0.1) == expected


def test_hash_split_is_stable_and_shares_follow_the_fractions():
    keys = [f"task-{i}" for i in range(4000)]
    splits = [hash_split(key, 0.2, 0.1) for key in keys]
    assert splits == [hash_split(key, 0.2, 0.1) for key in keys]
    assert abs(splits.count("test") / 4000 - 0.2) < 0.03 and abs(splits.count("dev") / 4000 - 0.1) < 0.03


@pytest.mark.parametrize(
    "every,expected",
    [
        (5, ["test", "dev", "train", "train", "train", "test", "dev"]),
        (3, ["test", "dev", "train", "test", "dev", "train", "test"]),
        (2, ["test", "train", "test", "train", "test", "train", "test"]),
    ],
)
def test_every_split_table(every, expected):
    assert [every_split(i, every) for i in range(7)] == expected


@pytest.mark.parametrize(
    "split,needle",
    [
        ("shifted", "toy: split 'shifted' is not supported by this environment"),
        ("val", "toy: unknown split 'val' (known: train, dev, test, shifted)"),
    ],
)
def test_unsupported_split_messages(split, needle):
    assert str(unsupported_split("toy", split)).startswith(needle)
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        check_split("toy", split)
    assert check_split("toy", split, SPLITS + ("val",)) == split


def _content(task) -> str:
    return task.messages[-1].content


NO_SHIFT = [
    ("instruction_following", {"test_size": 40, "dev_size": 40}),
    ("faithfulness", {}),
    ("code", {}),
    ("self_critique", {}),
    ("record_audit", {"n_records": 8, "dev_size": 20, "test_size": 20}),
]


@pytest.mark.parametrize("name,config", NO_SHIFT)
def test_dev_is_fixed_and_disjoint_from_train_and_test(name, config):
    env = make_environment(name, config)
    dev = [_content(t) for t in env.tasks("dev")]
    test = {_content(t) for t in env.tasks("test")}
    train = {_content(t) for seed in (0, 1) for t in env.tasks("train", seed=seed, n=300)}
    assert dev and dev == [_content(t) for t in make_environment(name, config).tasks("dev")]
    assert len(set(dev)) == len(dev) and not set(dev) & test and not (set(dev) | test) & train and train


@pytest.mark.parametrize("name,config", NO_SHIFT)
def test_shifted_is_a_one_line_error_naming_env_and_split(name, config):
    with pytest.raises(ValueError, match=f"^{name}: split 'shifted' is not supported") as err:
        list(make_environment(name, config).tasks("shifted"))
    assert "\n" not in str(err.value)


def test_critic_calibration_pairs_follow_the_sources_split():
    sources = [{"name": "math", "config": {"difficulty": 1}}]
    env = make_environment("critic_calibration", {"sources": sources})
    questions = {
        split: {p.prompt[-1].content for p in env.reference_pairs(split, 0, 30)}
        for split in ("train", "dev", "shifted")
    }
    math = make_environment("math", {"difficulty": 1})
    assert questions["dev"] <= {t.messages[-1].content for t in math.tasks("dev")}
    assert questions["shifted"] <= {t.messages[-1].content for t in math.tasks("shifted")}
    assert not questions["train"] & (questions["dev"] | questions["shifted"])
    assert len(list(env.tasks("dev", n=5))) == 5
