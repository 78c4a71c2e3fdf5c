"""`k2post recipe` (what `make demo` runs), scaled down: every stage chained under one run dir, the report, reruns.

The full-size demo (configs/recipe_demo.yaml, ~15 min) is what shows learning; its figures are in
docs/RL.md and docs/BENCHMARKS.md. Here the stages run with a handful of tasks, 2 SFT steps, one RL
iteration and short token budgets: the time goes to starting each stage's process and engines, which is
what the chaining, skipping and reporting need.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from proc_helpers import run_bounded

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "eval_n=2",
    "synth_overrides=[gym_tasks.0.tasks=60,gym_tasks.1.tasks=10,gym_tasks.2.tasks=20,gym_tasks.3.tasks=6,gym_tasks.4.tasks=6,"
    "tasks_per_domain=3]",
    "sft_overrides=[train.max_steps=2,schedule.warmup_steps=1,train.eval_every=2,checkpoint.every=2,train.log_every=1,"
    "data.max_seq_len=512]",
    # one iteration on short budgets (the eval stages read theirs from the same RL config): every stage runs, each
    # as little as it can
    "rl_overrides=[train.iterations=1,train.eval_every=0,train.eval_tasks_per_env=2,train.prompt_pool_per_env=8,"
    "checkpoint.every=0,"
    "rollout.prompts_per_iteration=4,rollout.samples_per_prompt=2,loss.groups_per_step=2,loss.micro_batch_size=4,"
    "loss.ptx_rows_per_step=2,rollout.engine.max_num_seqs=16,rollout.engine.kv_cache_gib=0.5,envs.2.weight=1.0,"
    "budget.default_max_tokens=16,budget.max_tokens.tool_use=48,budget.max_tokens.critic=16,"
    "rollout.agentic.max_turns=2,rollout.agentic.max_turn_tokens=24,rollout.agentic.max_episode_tokens=48,"
    "rollout.agentic.iteration_token_budget=null,"
    "loss.drop_uniform_groups=false]",  # a 2-step SFT model mostly scores 0 everywhere: keep its groups to train on
]


def _recipe(run_dir: Path, model_dir: Path, *extra: str, timeout: float = 900):
    argv = [
        sys.executable,
        "-m",
        "k2post.cli",
        "recipe",
        "configs/recipe_demo.yaml",
        f"run_dir={run_dir}",
        f"model.path={model_dir}",
        *SMALL,
        *extra,
    ]
    return run_bounded(argv, timeout=timeout, cwd=REPO)


def test_bad_stage_override_fails_before_any_stage(tmp_path, tiny_qwen2_dir):
    run_dir = tmp_path / "run"
    done = _recipe(run_dir, tiny_qwen2_dir, "rl_overrides=[loss.tau=-1]", timeout=120)
    assert done.returncode == 2 and "loss.tau" in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
        done.stderr
    )
    assert not run_dir.exists()


@pytest.mark.slow
def test_recipe_chains_every_stage_reports_and_skips_on_rerun(tiny_qwen2_dir):
    with tempfile.TemporaryDirectory(prefix="k2recipe_", dir="/tmp") as tmp:  # short: Ray's socket paths
        run_dir = Path(tmp) / "run"
        done = _recipe(run_dir, tiny_qwen2_dir)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        for path in (
            "synth/stats.json",
            "sft/final/config.json",
            "rl/final/config.json",
            "eval/before_rl.json",
            "eval/after_rl.json",
            "report.json",
            "heldout_before_after.png",
            "rl_config.yaml",
            "logs/rl.log",
        ):
            assert (run_dir / path).exists(), path
        report = json.loads((run_dir / "report.json").read_text())
        assert set(report["envs"]) == {"reasoning_gym", "math", "tool_use", "critic_calibration"}
        assert all(pair["before"]["n"] == 2 and pair["after"]["n"] == 2 for pair in report["envs"].values())
        assert set(report["shifted"]) == set(report["envs"]) and report["seed"] == 0
        assert set(report["stage_seconds"]) == {
            "synth",
            "sft",
            "eval_before_rl",  # test + shifted splits in one eval process
            "rl",
            "eval_after_rl",
        }
        shifted = json.loads((run_dir / "eval" / "before_rl_shifted.json").read_text())
        assert shifted["split"] == "shifted" and shifted["env_configs"]["tool_use"]["toolsets"] == ["calculator"]
        assert "heldout_accuracy.png" in report["rl_plots"] and "before RL" in done.stdout
        before = json.loads((run_dir / "eval" / "before_rl.json").read_text())
        assert (
            before["model"] == str(run_dir / "sft" / "final")
            and before["env_configs"]["reasoning_gym"]["dataset"] == "chain_sum"
        )
        rl = json.loads((run_dir / "rl" / "summary.json").read_text())
        assert rl["completed"] and rl["optimizer_steps"] >= 1

        again = _recipe(run_dir, tiny_qwen2_dir, timeout=300)  # every stage is complete: nothing reruns
        assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
        rerun = json.loads((run_dir / "report.json").read_text())
        assert rerun["stage_seconds"] == {} and rerun["envs"] == report["envs"]


@pytest.mark.parametrize("seed,expected", [(None, 0), (3, 3)])
def test_recipe_seed_reaches_every_stage_config(tmp_path, seed, expected):
    """`seed=S` on the recipe is the seed of the model init, synth, SFT and RL stages (null: each config's own)."""
    from k2post.config.registry import load_run_config
    from k2post_pipelines.recipe import Recipe

    overrides = [f"run_dir={tmp_path}", f"seed={'null' if seed is None else seed}"]
    recipe = Recipe(load_run_config(str(REPO / "configs" / "recipe_demo.yaml"), overrides, expected_kind="recipe"))
    assert recipe.seed_override("sft") == ([] if seed is None else [f"train.seed={seed}"])
    rl = load_run_config(str(recipe.rl_config_file()), [], expected_kind="rl")
    assert rl.seed == expected and rl.loss.ptx_data == str(
        tmp_path / "synth" / "dataset"
    )  # PTX reads this run's SFT data
    assert load_run_config(recipe.cfg.synth, recipe.seed_override("synth"), expected_kind="synth").seed == expected
    assert load_run_config(recipe.cfg.sft, recipe.seed_override("sft"), expected_kind="sft").train.seed == expected
    assert recipe.shifted_envs and set(recipe.shifted_envs) <= set(recipe.envs)


@pytest.mark.parametrize("path,expected", [("{run_dir}/model", "RUN/model"), ("models/mine", "models/mine")])
def test_recipe_model_path_follows_run_dir(tmp_path, path, expected):
    """`{run_dir}` in model.path puts each run's (each seed's) init under its own run dir; a plain path is kept."""
    from k2post.config.registry import load_run_config
    from k2post_pipelines.recipe import Recipe

    run_dir = str(tmp_path / "seed3")
    cfg = load_run_config(
        str(REPO / "configs" / "recipe_demo.yaml"), [f"run_dir={run_dir}", f"model.path={path}"], expected_kind="recipe"
    )
    assert Recipe(cfg).model == Path(expected.replace("RUN", run_dir))


@pytest.mark.parametrize("shifted_subset", [False, True])
def test_recipe_evals_share_one_process_when_the_splits_cover_the_same_envs(tmp_path, monkeypatch, shifted_subset):
    """Test and shifted splits over the same envs: one `k2post eval` (one engine build) writes both reports; a
    shifted set over fewer envs gets its own process. Reports land at eval/<name>.json and eval/<name>_shifted.json;
    a rerun with both present runs nothing."""
    import k2post_pipelines.recipe as recipe_module
    from k2post.config.registry import load_run_config

    calls = []

    def fake_stage(name, command, logs, timings):
        calls.append((name, command))
        splits = [command[i + 1] for i, arg in enumerate(command) if arg == "--split"]
        out = command[command.index("--out") + 1]
        for split in splits:
            Path(out.replace("{split}", split)).parent.mkdir(parents=True, exist_ok=True)
            Path(out.replace("{split}", split)).write_text(json.dumps({"split": split}))

    monkeypatch.setattr(recipe_module, "run_stage", fake_stage)
    cfg = load_run_config(str(REPO / "configs" / "recipe_demo.yaml"), [f"run_dir={tmp_path}"], expected_kind="recipe")
    recipe = recipe_module.Recipe(cfg)
    if shifted_subset:
        recipe.shifted_envs = recipe.envs[:1]
    out = recipe.evals("before_rl", tmp_path / "model", tmp_path / "rl.yaml")
    assert out == {"test": {"split": "test"}, "shifted": {"split": "shifted"}}
    assert (tmp_path / "eval" / "before_rl.json").is_file() and (tmp_path / "eval" / "before_rl_shifted.json").is_file()
    expected = ["eval_before_rl", "eval_before_rl_shifted"] if shifted_subset else ["eval_before_rl"]
    assert [name for name, _ in calls] == expected
    last = calls[-1][1]
    envs = [last[i + 1] for i, arg in enumerate(last) if arg == "--env"]
    assert envs == (recipe.envs[:1] if shifted_subset else recipe.envs)
    recipe.evals("before_rl", tmp_path / "model", tmp_path / "rl.yaml")
    assert len(calls) == len(expected)


def test_a_cut_sft_stage_continues_with_resume(tmp_path, monkeypatch):
    """A fresh SFT stage runs the recipe's SFT config; one whose run dir holds a config.yaml (cut) continues with
    `k2post sft --resume RUN_DIR` and the same overrides."""
    import k2post_pipelines.recipe as recipe_module
    from k2post.config.registry import load_run_config

    calls = []
    monkeypatch.setattr(recipe_module, "run_stage", lambda name, command, logs, timings: calls.append(command))
    cfg = load_run_config(str(REPO / "configs" / "recipe_demo.yaml"), [f"run_dir={tmp_path}"], expected_kind="recipe")
    recipe = recipe_module.Recipe(cfg)
    recipe.stage_sft()
    (recipe.sft).mkdir(parents=True)
    (recipe.sft / "config.yaml").write_text("kind: sft\n")
    recipe.stage_sft()
    fresh, cut = (command[command.index("sft") + 1 :] for command in calls)
    assert fresh[0] == cfg.sft and "--resume" not in fresh
    assert cut[:2] == ["--resume", str(recipe.sft)] and cut[2:] == fresh[1:]
