"""The synthesis run: tool specs -> agents -> tasks with rubrics -> trajectories -> judge -> dataset.

    stats = run_synth(SynthConfig(out_dir="runs/synth", tasks_per_domain=40))

Writes into `out_dir`:
- `shards/part-NNNNN.jsonl` — one line per decided trajectory (accepted or rejected), flushed and
  fsynced as it is written; a rerun with `resume: true` reads them and skips decided tasks (a line
  cut by a crash is ignored);
- `dataset/` — HF `datasets` dataset of the accepted trajectories (columns `id`, `messages`,
  `tools`, `metadata`, `verdict`, `domain`; JSON text columns: see docs/SYNTH.md), written
  atomically; `rejected/` the same for the rejects;
- `heldout_tasks.jsonl` — test-split tasks (never synthesized) for evaluating a trained model;
- `tool_specs/` — the MCP-style specs of every domain used; `stats.json` — the report; `config.yaml` — the
  resolved config (`k2post synth --resume OUT_DIR` continues from it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from k2post.command import UserError
from k2post.config.loader import dump_yaml
from k2post.synth.config import SynthConfig
from k2post.synth.domains import Domain
from k2post.synth.prompt_rows import prompt_row_id
from k2post.toolsets import TOOLSETS
from k2post.synth.gym_tasks import gym_row, gym_tasks
from k2post.synth.judge import AllJudges, AnswerJudge, Judge, LLMJudge, RubricJudge, TrajectoryVerdict
from k2post.synth.roles import LLMAgent, LLMToolSimulator, LLMUser, ReferenceAgent, RuleToolSimulator, RuleUser
from k2post.synth.specs import ToolSpecError, domain_spec_json
from k2post.synth.tasks import SynthTask, agent_for, make_tasks
from k2post.synth.trajectory import Trajectory, openai_messages, run_trajectory


class SynthError(UserError, RuntimeError):
    """The run cannot start (bad specs, a domain without a simulator, ...)."""


# ----------------------------------------------------------------------------- specs and tasks


def check_specs(cfg: SynthConfig, domains: dict[str, Domain], console: Console) -> dict[str, list]:
    """Load the spec files; every listed built-in domain's spec must match its simulator's tool names and
    schemas (descriptions may differ: the file's are shown to the agent); spec domains use their own."""
    loaded = {spec.domain: spec for spec in cfg.spec_domains()}
    tools = {}
    for name, domain in domains.items():
        spec = loaded.get(name)
        if spec is None or name not in TOOLSETS:
            tools[name] = domain.tools()  # synthetic and spec domains: the simulator's tools are the spec's
            continue
        theirs = {(t.name, json.dumps(t.parameters, sort_keys=True)) for t in spec.tools}
        ours = {(t.name, json.dumps(t.parameters, sort_keys=True)) for t in domain.tools()}
        if theirs != ours:
            diff = sorted({n for n, _ in theirs ^ ours})
            raise SynthError(
                f"{spec.source}: tools {diff} differ from the {name!r} simulator's (names and inputSchema must match)"
            )
        tools[name] = spec.tools
    extra = sorted(set(loaded) - set(domains))
    if extra:
        console.print(f"note: spec domains {extra} are not in `domains`: skipped (list them there to synthesize them)")
    return tools


def write_specs(out: Path, domains: dict[str, Domain], tools: dict[str, list]) -> None:
    target = out / "tool_specs"
    target.mkdir(parents=True, exist_ok=True)
    for name, domain in domains.items():
        toolset = domain.toolset
        spec = domain_spec_json(
            name, domain.description, tools[name], toolset.output_schemas(), toolset.tool_annotations()
        )
        (target / f"{name}.json").write_text(spec)


def all_tasks(cfg: SynthConfig, domains: dict[str, Domain], split: str, n: int) -> list[SynthTask]:
    return [
        t
        for d in focused(domains, cfg.templates).values()
        for t in make_tasks(d, split, n, cfg.seed, cfg.personas, cfg.test_fraction)
    ]


def focused(domains: dict[str, Domain], templates: list[str]) -> dict[str, Domain]:
    """The domains with only the listed templates (all of them when the list is empty)."""
    if not templates:
        return domains
    return {
        name: dataclasses.replace(d, templates={t: f for t, f in d.templates.items() if t in templates})
        for name, d in domains.items()
    }


# ----------------------------------------------------------------------------- one trajectory


def _client(cfg: SynthConfig):
    """The HTTP client of `cfg.llm` (None without one), checked with one tiny call first (`endpoint_problem`): an
    unreachable endpoint is one SynthError line, not a failed attempt on every task."""
    if cfg.llm is None:
        return None
    from k2post.llm.http_client import HTTPLLMClient, endpoint_problem

    client = HTTPLLMClient(cfg.llm)
    problem = endpoint_problem(client, cfg.llm.base_url)
    if problem is not None:
        client.close()
        raise SynthError(problem)
    return client


def make_judge(cfg: SynthConfig, client) -> Judge:
    sampling = {"temperature": 0.0, "max_tokens": cfg.llm_sampling.max_tokens}
    judges: list[Judge] = []
    if "rubric" in cfg.judge:
        judges.append(RubricJudge())
    if "llm" in cfg.judge:
        judges.append(LLMJudge(client, **sampling))
    return judges[0] if len(judges) == 1 else AllJudges(judges)


def synthesize(
    cfg: SynthConfig, domain: Domain, tools: list, task: SynthTask, attempt: int, client
) -> tuple[Trajectory, dict[str, Any], dict[str, Any]]:
    """One trajectory for a task: (trajectory, final simulator state dump, metadata)."""
    rng = random.Random(f"{cfg.seed}:{task.id}:{attempt}")
    sampling = cfg.llm_sampling.model_dump()
    state = domain.new_state(task.scenario)
    direct = cfg.agent == "reference" and answers_directly(cfg, task)
    agent = (
        LLMAgent(client, keep_reasoning=cfg.reasoning, **sampling)
        if cfg.agent == "llm"
        else ReferenceAgent(task, rng, cfg.mistake_rate, direct=direct, reasoning=cfg.reasoning)
    )
    user = LLMUser(client, task, **sampling) if cfg.user_simulator == "llm" else RuleUser(task)
    if cfg.tool_simulator == "llm":
        world = f"{domain.description}; initial state {json.dumps(task.scenario.initial_state)}"
        tool_sim = LLMToolSimulator(client, tools, world, domain.toolset.output_schemas(), **sampling)
    else:
        tool_sim = RuleToolSimulator(domain.toolset, state, cfg.tool_failure_rate)
    system = agent_for(domain).system_prompt
    trajectory = run_trajectory(system, tools, agent, user, tool_sim, cfg.max_turns)
    metadata = {
        "task_id": task.id,
        "domain": task.domain,
        "template": task.scenario.template,
        "persona": task.persona,
        "attempt": attempt,
        "agent": cfg.agent,
        "mistake": getattr(agent, "mistake", None),
        "direct": direct,
        "turns": trajectory.turns,
        "tool_calls": len(trajectory.calls),
        "tool_errors": sum(not c.ok for c in trajectory.calls),
    }
    return trajectory, state.model_dump(mode="json"), metadata


def answers_directly(cfg: SynthConfig, task: SynthTask) -> bool:
    """Whether the reference agent answers `task` without tools: a seeded `direct_answer_rate` share of the tasks of
    `direct_answer_templates` (all when null), the same for every attempt."""
    if cfg.direct_answer_rate == 0 or (
        cfg.direct_answer_templates is not None and task.scenario.template not in cfg.direct_answer_templates
    ):
        return False
    return random.Random(f"{cfg.seed}:{task.id}:direct").random() < cfg.direct_answer_rate


def make_row(
    task: SynthTask, tools: list, trajectory: Trajectory, metadata: dict[str, Any], verdict: TrajectoryVerdict
) -> dict[str, Any]:
    return {
        "id": task.id,
        "domain": task.domain,
        "attempt": metadata["attempt"],
        "accepted": verdict.accepted,
        "messages": openai_messages(trajectory.messages),
        "tools": [t.to_openai() for t in tools],
        "metadata": metadata,
        "verdict": {**verdict.model_dump(), "error": trajectory.error},
    }


# ----------------------------------------------------------------------------- shards (resume)


def read_shards(shard_dir: Path) -> list[dict[str, Any]]:
    """Every complete row of every shard (a line cut by a crash at a file's end is skipped)."""
    rows = []
    for path in sorted(shard_dir.glob("part-*.jsonl")):
        lines = path.read_text().split("\n")
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if number < len(lines) - 2:
                    raise SynthError(f"{path}:{number + 1}: corrupt shard line (not at the end of the file)") from None
    return rows


class ShardWriter:
    """Appends rows to a new shard file, each line flushed and fsynced."""

    def __init__(self, shard_dir: Path):
        shard_dir.mkdir(parents=True, exist_ok=True)
        self.path = shard_dir / f"part-{len(list(shard_dir.glob('part-*.jsonl'))):05d}.jsonl"
        self.file = self.path.open("a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self.file.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


def decided_tasks(rows: list[dict[str, Any]], attempts: int) -> set[str]:
    """Tasks with an accepted row, or with every attempt used."""
    tries = Counter(row["id"] for row in rows)
    return {row["id"] for row in rows if row["accepted"]} | {task for task, n in tries.items() if n >= attempts}


# ----------------------------------------------------------------------------- the run


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]synth"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("accepted {task.fields[accepted]}"),
        TimeElapsedColumn(),
        console=console,
    )


def synthesize_all(
    cfg: SynthConfig, domains, tools, tasks: list[SynthTask], writer: ShardWriter, console: Console
) -> None:
    client = _client(cfg)
    judge, answer_judge = make_judge(cfg, client), AnswerJudge()
    with _progress(console) as progress:
        bar = progress.add_task("synth", total=len(tasks), accepted=0)
        accepted = 0
        for task in tasks:
            for attempt in range(cfg.attempts_per_task):
                trajectory, state, metadata = synthesize(
                    cfg, domains[task.domain], tools[task.domain], task, attempt, client
                )
                verdict = (answer_judge if metadata["direct"] else judge).judge(task, trajectory, state)
                writer.write(make_row(task, tools[task.domain], trajectory, metadata, verdict))
                if verdict.accepted:
                    accepted += 1
                    break
            progress.update(bar, advance=1, accepted=accepted)


def synthesize_gyms(
    cfg: SynthConfig, jobs: list[tuple[Any, Any, list]], done: set[str], writer: ShardWriter, console: Console
) -> None:
    """Reference answers for the gym tasks without a row yet (one attempt each), judged by the gym's verifier."""
    todo = [(g, env, task) for g, env, tasks in jobs for task in tasks if gym_row_id(g.key, task.id) not in done]
    if not todo:
        return
    with _progress(console) as progress:
        bar = progress.add_task("synth", total=len(todo), accepted=0)
        accepted = 0
        for gym, env, task in todo:
            row = gym_row(gym, env, task, cfg.seed, cfg.mistake_rate)
            row["id"] = gym_row_id(gym.key, task.id)
            writer.write(row)
            accepted += row["accepted"]
            progress.update(bar, advance=1, accepted=accepted)


def load_prompt_tasks(cfg: SynthConfig, console: Console) -> list:
    """The rows of every `prompt_datasets` entry; unusable rows are reported (first three) and skipped."""
    from k2post.sft.sources import SFTDataError
    from k2post.synth.prompt_rows import prompt_tasks

    tasks = []
    for entry in cfg.prompt_datasets:
        try:
            found, problems = prompt_tasks(entry)
        except SFTDataError as err:
            raise SynthError(f"prompt_datasets[{entry.key}]: {err}".replace("data.path", "path")) from None
        for line in problems[:3]:
            console.print(f"prompt_datasets[{entry.key}]: skipped {line}")
        if problems:
            console.print(f"prompt_datasets[{entry.key}]: {len(problems)} of {len(problems) + len(found)} rows skipped")
        if not found:
            raise SynthError(f"prompt_datasets[{entry.key}]: no usable row in {entry.path}")
        tasks += found
    return tasks


def synthesize_prompts(cfg: SynthConfig, tasks: list, writer: ShardWriter, console: Console) -> None:
    """The LLM agent continues each prompt (one attempt), the LLM judge decides."""
    from k2post.synth.prompt_rows import prompt_row

    if not tasks:
        return
    client, sampling = _client(cfg), cfg.llm_sampling.model_dump()
    judge = LLMJudge(client, temperature=0.0, max_tokens=cfg.llm_sampling.max_tokens)
    with _progress(console) as progress:
        bar = progress.add_task("synth", total=len(tasks), accepted=0)
        accepted = 0
        for task in tasks:
            tool_sim = LLMToolSimulator(client, task.tools, "the tools of the user's request", **sampling)
            row = prompt_row(
                task, LLMAgent(client, keep_reasoning=cfg.reasoning, **sampling), tool_sim, judge, cfg.max_turns
            )
            writer.write(row)
            accepted += row["accepted"]
            progress.update(bar, advance=1, accepted=accepted)


def gym_row_id(entry_key: str, task_id: str) -> str:
    """A gym row's id: the gym_tasks entry's key (its label, else its env) and the task id."""
    return f"{entry_key}/{task_id}"


def run_synth(cfg: SynthConfig, console: Console | None = None) -> dict[str, Any]:
    """Run (or resume) a synthesis; returns the stats also written to out_dir/stats.json."""
    console = console or Console()
    out = Path(cfg.out_dir)
    if out.exists() and not cfg.resume:
        shutil.rmtree(out / "shards", ignore_errors=True)
    try:
        domains = cfg.build_domains()
        tools = check_specs(cfg, domains, console)
    except (ToolSpecError, ValueError) as err:
        raise SynthError(str(err)) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_yaml(cfg))  # what `k2post synth --resume OUT_DIR` reads
    write_specs(out, domains, tools)
    write_heldout(out / "heldout_tasks.jsonl", all_tasks(cfg, domains, "test", cfg.heldout_tasks_per_domain))
    tasks = all_tasks(cfg, domains, "train", cfg.tasks_per_domain)
    decided_rows = read_shards(out / "shards")
    done = decided_tasks(decided_rows, cfg.attempts_per_task)
    todo = [t for t in tasks if t.id not in done]
    if done:
        console.print(f"resuming: {len(tasks) - len(todo)} of {len(tasks)} tasks already decided")
    try:
        jobs = [(g, *gym_tasks(g, cfg.seed)) for g in cfg.gym_tasks]
    except ValueError as err:
        raise SynthError(str(err)) from None
    prompts = load_prompt_tasks(cfg, console)
    wanted = {t.id for t in tasks} | {gym_row_id(g.key, t.id) for g, _, env_tasks in jobs for t in env_tasks}
    wanted |= {prompt_row_id(t) for t in prompts}
    writer = ShardWriter(out / "shards")
    try:
        synthesize_all(cfg, domains, tools, todo, writer, console)
        synthesize_gyms(cfg, jobs, {r["id"] for r in decided_rows}, writer, console)
        decided_ids = {r["id"] for r in decided_rows}  # one attempt each, as for gym rows
        synthesize_prompts(cfg, [t for t in prompts if prompt_row_id(t) not in decided_ids], writer, console)
    finally:
        writer.close()
    rows = [r for r in read_shards(out / "shards") if r["id"] in wanted]
    write_datasets(out, rows, cfg.keep_rejected)
    stats = synth_stats(rows, len(wanted))
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    console.print(stats_table(stats))
    return stats


def write_heldout(path: Path, tasks: list[SynthTask]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(task.model_dump_json() + "\n" for task in tasks))
    tmp.replace(path)


def read_heldout(path: str | Path) -> list[SynthTask]:
    """The held-out tasks a run wrote (for evaluation)."""
    return [SynthTask.model_validate_json(line) for line in Path(path).read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------- outputs


def dataset_columns(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Rows as the dataset's columns (nested values as JSON text)."""
    dump = lambda value: json.dumps(value, ensure_ascii=False)  # noqa: E731
    return {
        "id": [r["id"] if r["accepted"] else f"{r['id']}#attempt{r['attempt']}" for r in rows],
        "messages": [dump(r["messages"]) for r in rows],
        "tools": [dump(r["tools"]) for r in rows],
        "metadata": [dump(r["metadata"]) for r in rows],
        "verdict": [dump(r["verdict"]) for r in rows],
        "domain": [r["domain"] for r in rows],
    }


def save_dataset_atomic(columns: dict[str, list[str]], target: Path) -> None:
    from datasets import Dataset

    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    Dataset.from_dict(columns).save_to_disk(str(tmp))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def write_datasets(out: Path, rows: list[dict[str, Any]], keep_rejected: bool) -> None:
    accepted = {r["id"]: r for r in rows if r["accepted"]}  # one per task (a resumed run cannot add a second)
    save_dataset_atomic(dataset_columns(sorted(accepted.values(), key=lambda r: r["id"])), out / "dataset")
    if keep_rejected:
        save_dataset_atomic(dataset_columns([r for r in rows if not r["accepted"]]), out / "rejected")


def synth_stats(rows: list[dict[str, Any]], n_tasks: int) -> dict[str, Any]:
    """Accepted / rejected counts by reason and per domain."""
    reasons = Counter(reason.split(":")[0] for r in rows if not r["accepted"] for reason in r["verdict"]["reasons"])
    detailed = Counter(reason for r in rows if not r["accepted"] for reason in r["verdict"]["reasons"])
    per_domain: dict[str, Counter] = {}
    for r in rows:
        per_domain.setdefault(r["domain"], Counter())["accepted" if r["accepted"] else "rejected"] += 1
    accepted_tasks = {r["id"] for r in rows if r["accepted"]}
    caught = Counter(r["metadata"]["mistake"] for r in rows if r["metadata"].get("mistake") and not r["accepted"])
    injected = Counter(r["metadata"]["mistake"] for r in rows if r["metadata"].get("mistake"))
    return {
        "tasks": n_tasks,
        "tasks_accepted": len(accepted_tasks),
        "trajectories": len(rows),
        "accepted": sum(r["accepted"] for r in rows),
        "rejected": sum(not r["accepted"] for r in rows),
        "rejected_by_reason": dict(reasons.most_common()),
        "rejected_by_detail": dict(detailed.most_common()),
        "per_domain": {
            d: {"accepted": c["accepted"], "rejected": c["rejected"]} for d, c in sorted(per_domain.items())
        },
        "mistakes_injected": dict(injected),
        "mistakes_rejected": dict(caught),
        "direct_accepted": sum(bool(r["accepted"] and r["metadata"].get("direct")) for r in rows),
    }


def stats_table(stats: dict[str, Any]) -> Table:
    table = Table(
        title=f"synthesis: {stats['tasks_accepted']}/{stats['tasks']} tasks kept, "
        f"{stats['accepted']} accepted / {stats['rejected']} rejected trajectories"
    )
    table.add_column("domain")
    table.add_column("accepted", justify="right")
    table.add_column("rejected", justify="right")
    for domain, counts in stats["per_domain"].items():
        table.add_row(domain, str(counts["accepted"]), str(counts["rejected"]))
    for reason, count in stats["rejected_by_reason"].items():
        table.add_row(f"[dim]rejected: {reason}", "", str(count))
    return table
