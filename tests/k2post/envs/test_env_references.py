"""Registering an environment without packaging: `module:Class` or `file.py:Class` in a mix, loaded in every
process through K2POST_ENV_PLUGINS; one-line errors for bad references."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from k2post.config.loader import validate_config
from k2post.envs.mix import EnvEntryConfig
from k2post.envs.registry import PLUGINS_ENV_VAR, unregister_environment

PLUGIN = textwrap.dedent(
    """
    from k2post.envs import Environment, Reward, Task
    from k2post.chat.types import Message

    class WordCount(Environment):
        name = "{name}"
        task_type = "toy"

        def tasks(self, split="train", seed=0, n=None):
            for i in range(n or 2):
                yield Task(id=f"{{split}}-{{i}}", env=self.name, task_type="toy",
                           messages=[Message(role="user", content="Say three words.")], answer=3)

        def score(self, task, response):
            return Reward(value=float(len(response.split()) == task.answer))
    """
)


@pytest.fixture
def plugin_env(monkeypatch):
    """A clean K2POST_ENV_PLUGINS for the test; the names it registers are removed after."""
    monkeypatch.delenv(PLUGINS_ENV_VAR, raising=False)
    names = []
    yield names
    for name in names:
        unregister_environment(name)


def test_a_file_reference_in_a_mix_registers_the_class_for_every_process(tmp_path, plugin_env):
    from k2post.envs.workers import RewardPool

    path = tmp_path / "my_env.py"
    path.write_text(PLUGIN.format(name="word_count_file"))
    plugin_env.append("word_count_file")
    entry = EnvEntryConfig(name=f"{path}:WordCount")
    assert entry.name == "word_count_file" and os.environ[PLUGINS_ENV_VAR] == f"{path.resolve()}:WordCount"
    assert entry.plugin == f"{path.resolve()}:WordCount"  # what a saved run config keeps
    task = next(entry.make().tasks())
    with RewardPool(num_workers=1, timeout_s=30) as pool:  # a worker process: it loads the plugin by the env var
        (reward,) = pool.score_batch([("word_count_file", {}, task, "one two three")])
    assert (reward.value, reward.error) == (1.0, None)
    code = "from k2post.envs import make_environment; print(make_environment('word_count_file').name)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "word_count_file", done.stderr[-2000:]


def test_a_module_reference_on_sys_path(tmp_path, monkeypatch, plugin_env):
    (tmp_path / "my_gym_module.py").write_text(PLUGIN.format(name="word_count_module"))
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin_env.append("word_count_module")
    entry = EnvEntryConfig(name="my_gym_module:WordCount", weight=2.0)
    assert entry.name == "word_count_module" and os.environ[PLUGINS_ENV_VAR] == "my_gym_module:WordCount"
    assert EnvEntryConfig(name="word_count_module").name == "word_count_module"  # registered by name from now on


@pytest.mark.parametrize(
    "reference, message",
    [
        ("missing_dir/nope.py:Env", "file '{cwd}/missing_dir/nope.py' not found"),
        ("json:Nope", "'json:Nope': module 'json' has no 'Nope'"),
        ("json:dumps", "is not an Environment subclass"),
        ("no_such_module_k2:Env", "'no_such_module_k2:Env' failed to import: ModuleNotFoundError"),
        (":Env", "expected 'package.module:Class' or 'path/to/file.py:Class'"),
        ("{broken}:Env", "failed to import: ZeroDivisionError: division by zero"),
    ],
)
def test_bad_references_are_one_line_errors(tmp_path, plugin_env, reference, message):
    broken = tmp_path / "broken.py"
    broken.write_text("1 / 0\n")
    with pytest.raises(ValueError) as raised:
        validate_config(EnvEntryConfig, {"name": reference.format(broken=broken)}, "envs[0]")
    text = str(raised.value)
    assert message.format(cwd=os.getcwd()) in text and "\n" not in text.strip(), text
    assert PLUGINS_ENV_VAR not in os.environ


def test_a_broken_env_var_plugin_is_disabled_with_one_warning(tmp_path, monkeypatch, caplog):
    """Loaded in a fresh process: the broken reference is skipped with one warning, the built-ins still work,
    and asking for it by reference says why."""
    monkeypatch.setenv(PLUGINS_ENV_VAR, f"{tmp_path / 'gone.py'}:Env")
    code = "from k2post.envs import make_environment; print(make_environment('math').name)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "math", done.stderr[-2000:]
    warning = [line for line in done.stderr.splitlines() if "environment plugin disabled" in line]
    assert warning == [
        f"k2post: warning: environment plugin disabled: {PLUGINS_ENV_VAR} entry "
        f"'{tmp_path / 'gone.py'}:Env': file '{tmp_path / 'gone.py'}' not found"
    ]

    code = "from k2post.envs import make_environment; make_environment('dice')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]  # a Ray actor asked for the plugin's env by name: why it is unknown
    assert last.startswith("k2post.envs.registry.EnvironmentRegistryError: unknown environment 'dice' (")
    assert last.endswith(
        f"; {PLUGINS_ENV_VAR} entry '{tmp_path / 'gone.py'}:Env': file '{tmp_path / 'gone.py'}' not found"
    )


def test_a_saved_entry_loads_its_plugin_in_a_fresh_process(tmp_path, plugin_env):
    """A run config written after validation names the env and its plugin: a resumed run in a new process (no
    K2POST_ENV_PLUGINS) finds the class again."""
    path = tmp_path / "saved_env.py"
    path.write_text(PLUGIN.format(name="word_count_saved"))
    plugin_env.append("word_count_saved")
    dumped = EnvEntryConfig(name=f"{path}:WordCount", config={}).model_dump(mode="json")
    assert dumped["name"] == "word_count_saved" and dumped["plugin"] == f"{path.resolve()}:WordCount"
    code = (
        "import json, sys; from k2post.envs.mix import EnvEntryConfig; "
        "print(EnvEntryConfig(**json.loads(sys.argv[1])).make().name)"
    )
    env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV_VAR}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(dumped)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "word_count_saved", done.stderr[-2000:]


@pytest.mark.parametrize(
    "second, message",
    [
        ("missing_k2_env.py:Env", "mix.yaml: envs.1: 'missing_k2_env.py:Env': file "),
        ("mathh", "mix.yaml: envs.1.name: unknown environment 'mathh' (did you mean 'math'?)"),
    ],
)
def test_a_bad_second_entry_is_blamed_as_the_second(plugin_env, second, message):
    from k2post.envs.mix import EnvMixConfig

    with pytest.raises(ValueError) as raised:
        validate_config(EnvMixConfig, {"envs": [{"name": "math"}, {"name": second}]}, "mix.yaml")
    assert str(raised.value).startswith(message), str(raised.value)


def test_golden_test_takes_the_reference_the_cli_takes(tmp_path, monkeypatch, plugin_env):
    """`golden_test("plugins/x.py:Class", path)` passes the cases `k2post envs test plugins/x.py:Class` passes:
    both resolve the reference to the class's registered name (a relative path from the working directory)."""
    from k2post.envs.golden import run_golden
    from k2post.envs.pytest_plugin import assert_golden, golden_params

    monkeypatch.chdir(tmp_path)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "wc.py").write_text(PLUGIN.format(name="word_count_golden"))
    plugin_env.append("word_count_golden")
    golden = tmp_path / "wc.jsonl"
    cases = [
        {"id": "three", "task": {"index": 0}, "response": "one two three", "expected": 1.0},
        {"id": "two", "task": {"index": 1, "split": "test"}, "response": "one two", "expected": 0.0},
    ]
    golden.write_text("".join(json.dumps(case) + "\n" for case in cases))
    reference = "plugins/wc.py:WordCount"
    assert [r.passed for r in run_golden(reference, golden)] == [True, True]
    params = golden_params(reference, golden)
    assert [str(p.values[0]) for p in params] == ["word_count_golden:three", "word_count_golden:two"]
    for param in params:
        assert_golden(param.values[0])  # raises pytest's Failed on a miss
