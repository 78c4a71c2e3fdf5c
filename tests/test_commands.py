"""One entry-point shape: every `k2post <command>` is `pipelines/<command>.py:main`, errors are one line.

Config errors are checked in process, through `k2post <command>` and `python -m pipelines.<command>`'s
`main` alike: exactly one stderr line `k2post <command>: error: ...`, exit status 2; and in a fresh process, before
torch, transformers, vLLM, Ray or DeepSpeed is imported (all but `rl`).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from k2post.cli import COMMANDS, main
from k2post.command import USER_ERRORS, UserError, report_error

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_is_a_pipelines_module_with_main_and_its_own_parser(name):
    module_name = COMMANDS[name].module
    assert (REPO / "pipelines" / f"{module_name}.py").is_file()
    module = importlib.import_module(f"pipelines.{module_name}")
    assert callable(module.main) and module.build_parser().prog == f"k2post {name}"


def test_help_lists_the_table_and_unknown_commands_are_one_line(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)
    assert main(["sfx", "configs/sft_tool_use.yaml"]) == 2
    assert capsys.readouterr().err == "k2post: error: unknown command 'sfx' (did you mean 'sft'?)\n"


def test_k2post_starts_without_importing_the_commands():
    code = "import sys, k2post.cli; assert not [m for m in sys.modules if m.startswith(('pipelines', 'torch'))]"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def _model_dir(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


CONFIG_ERRORS = {
    "synth": (["configs/demo.yaml"], "the command needs kind 'synth'"),
    "sft": (["configs/sft_tool_use.yaml", "train.lr=1"], "train.lr: unknown key"),
    "rl": (["configs/rl_demo.yaml", "loss.tau=-1"], "loss.tau"),
    "recipe": (["configs/nope.yaml"], "configs/nope.yaml: config file not found"),
    "demo": (["configs/demo.yaml", "sampling.temprature=0.5"], "did you mean 'temperature'?"),
    "eval": (["{model}", "--env", "math", "--samples", "4"], "temperature > 0"),
}


@pytest.mark.parametrize("via", ["k2post", "pipelines"])
@pytest.mark.parametrize("name", list(CONFIG_ERRORS))
def test_config_error_is_one_line_with_the_command_prefix(capsys, monkeypatch, tmp_path, name, via):
    monkeypatch.chdir(REPO)
    args, needle = CONFIG_ERRORS[name]
    model = str(_model_dir(tmp_path / "m"))
    args = [a.replace("{model}", model) for a in args]
    if via == "k2post":
        status = main([name, *args])
    else:
        status = importlib.import_module(f"pipelines.{COMMANDS[name].module}").main(args)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith(f"k2post {name}: error: ") and err.count("\n") == 1 and needle in err, err


# Run in a fresh process: the pytest process has long imported torch. `rl` is left out (pipelines/rl.py imports its
# controller before it validates the config).
NO_TORCH_BEFORE_VALIDATION = """
import json, sys
from k2post.cli import main
heavy = {}
for argv in json.loads(sys.argv[1]):
    assert main(argv) == 2, argv
    heavy[argv[0]] = [m for m in ("torch", "transformers", "vllm", "ray", "deepspeed") if m in sys.modules]
print(json.dumps(heavy))
"""


def test_config_errors_come_before_torch_and_vllm_are_imported(tmp_path):
    """A mistake is one line in well under a second: each command validates before its heavy imports."""
    model = str(_model_dir(tmp_path / "m"))
    cases = [[name, *(a.replace("{model}", model) for a in args)] for name, (args, _) in CONFIG_ERRORS.items()]
    cases += [
        ["eval", model, "--env", "maths"],
        ["config", "show", "configs/demo.yaml", "sampling.temprature=0.5"],
        ["model", "init", "--flavor", "tiny-gpt9", "--out", str(tmp_path / "unused")],
    ]
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH_BEFORE_VALIDATION, json.dumps(cases)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    heavy = json.loads(done.stdout.splitlines()[-1])
    assert sorted(heavy) == sorted({argv[0] for argv in cases}) and not any(heavy.values()), heavy


def test_usage_errors_are_argparse_s_with_the_same_prefix(capsys):
    assert main(["synth", "--nope"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == "k2post synth: error: unrecognized arguments: --nope"
    assert main(["rl"]) == 2
    assert capsys.readouterr().err == "k2post rl: error: give a CONFIG or --resume RUN_DIR\n"


def test_a_multi_line_message_ends_with_the_one_error_line(capsys):
    """A server's log tail (ServerStartError) comes before the error line, which names the log."""
    from k2post.llm.serve import ServerStartError

    err = ServerStartError("vLLM server exited with status 3 before it was ready; log /tmp/s.log:\nboom\nbad model")
    assert report_error("k2post serve", err) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "boom",
        "bad model",
        "k2post serve: error: vLLM server exited with status 3 before it was ready; log /tmp/s.log",
    ]


def test_the_known_user_errors_are_caught():
    from k2post.config.loader import ConfigError
    from k2post.envs.golden import GoldenFileError
    from k2post.envs.registry import EnvironmentRegistryError
    from k2post.llm.serve import ServerStartError
    from k2post.rl.controller import RLRunDirError
    from k2post.sft.data import SFTDataError
    from k2post.sft.trainer import RunDirError
    from k2post.synth.pipeline import SynthError
    from k2post.train.checkpoint import ResumeError
    from k2post_pipelines.recipe import StageError

    known = [ConfigError, GoldenFileError, EnvironmentRegistryError, ServerStartError, RLRunDirError, SFTDataError]
    known += [RunDirError, SynthError, ResumeError, StageError, FileNotFoundError, FileExistsError, KeyError]
    assert all(issubclass(cls, USER_ERRORS) for cls in known)
    assert issubclass(SynthError, (UserError, RuntimeError)) and not issubclass(RuntimeError, USER_ERRORS)


@pytest.mark.parametrize(
    "file, overrides, resume, expected",
    [
        ("c.yaml", ["a=1"], None, ("c.yaml", ["a=1"])),
        ("a=1", ["b=2"], "RUN", ("RUN/config.yaml", ["resume=true", "run_dir=RUN", "x=null", "a=1", "b=2"])),
        (None, [], "RUN", ("RUN/config.yaml", ["resume=true", "run_dir=RUN", "x=null"])),
        ("c.yaml", ["resume=auto"], None, ("c.yaml", ["resume=auto"])),  # auto: continue when run_dir holds a run
    ],
)
def test_resume_config_is_the_one_resume_spelling(tmp_path, file, overrides, resume, expected):
    from k2post.command import resume_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("kind: sft\n")
    resume = None if resume is None else str(run)
    got = resume_config(file, overrides, resume, "sft", "run_dir", ("x=null",))
    config, fixed = expected
    assert got == (config.replace("RUN", str(run)), [item.replace("RUN", str(run)) for item in fixed])


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["sft", "configs/sft_demo.yaml", "resume=true"], "resume=...: continue a sft run with `k2post sft --resume"),
        (["rl", "configs/rl_demo.yaml", "resume=true"], "resume=...: continue a rl run with `k2post rl --resume"),
        (["sft", "--resume", "/nonexistent/run"], "--resume /nonexistent/run: no config.yaml there"),
        (["sft"], "give a CONFIG or --resume RUN_DIR"),
    ],
)
def test_resume_errors_are_one_line(capsys, argv, needle):
    from k2post.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("command", ["rl", "sft"])
def test_a_relative_run_dir_inside_a_ray_job_is_refused_in_one_line(tmp_path, monkeypatch, capsys, command):
    """Under `ray job submit` the driver runs in Ray's unpacked working dir, which `ray stop` deletes."""
    from k2post.cli import main

    repo = Path(__file__).resolve().parents[1]
    job_dir = tmp_path / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0"
    job_dir.mkdir(parents=True)
    config = repo / "configs" / ("rl_demo.yaml" if command == "rl" else "sft_demo.yaml")
    monkeypatch.chdir(job_dir)
    assert main([command, str(config), "run_dir=runs/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"k2post {command}: error: run_dir='runs/x' is relative to this Ray job's temporary working dir, which "
        "`ray stop` deletes: pass an absolute path, e.g. `run_dir=$PWD/runs/x` after the config"
    )
    assert not (job_dir / "runs").exists()
