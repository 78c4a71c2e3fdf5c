"""Benchmark: does a Qwen2-0.5B-shaped model go through SFT, RL and eval on this box? Memory and time per phase.

Run: `python benchmarks/scale.py [--models qwen2-0.5b tiny-k2] [--out runs/scale] [--also-zero 1] [--keep]` (from
the repo root; ~10 minutes for both models on the 2-core dev box, ~12 with `--also-zero 1`; `--smoke` = tiny-qwen2
only, the smallest sizes: a check that every step runs, its figures mean nothing).

Per model (a flavor, random init, built by `k2post model init`), each step is the real `k2post` command in a child
process whose whole process tree is sampled (RSS of every descendant, summed, every 0.25 s; `/proc/PID/status`
VmHWM per process; PSS every 2 s, which splits shared pages such as the checkpoint engine's /dev/shm buffers and
the libraries' text fairly between processes):

1. trainer alone: `k2post sft` for one optimizer step (MuonClip, fp32, DeepSpeed at the RL run's `--zero-stage`,
   one packed row of `--sft-seq-len` tokens) on a small generated chat set; its metrics give the step time
   (`--also-zero 1`: the same at ZeRO-1 too, the RL default, for the memory it adds on one rank);
2. engine alone: `k2post eval MODEL --env math` (`--eval-n` tasks, greedy, `--max-tokens`): one vLLM engine with
   eval's engine settings (float32, max_model_len 2048, 64 seqs, KV cache 1 GiB), which the RL run below uses too;
3. colocated: `k2post rl` for one iteration (the math env, `--prompts` x `--samples` episodes, one optimizer step
   on all of them: rollout, reward, pi_old, step, push) with its before and after evals (`--eval-n` tasks),
   one trainer rank + one rollout actor in one placement-group bundle of an embedded Ray (its own temp dir,
   2 CPUs). Times per phase are the run's own `time/*_s` metrics; the tree's memory is split by process role
   (driver, trainer actor, rollout actor, Ray's gcs/raylet/agents, idle Ray workers, reward workers);
4. push GB/s: the RL run's weight push (`push/mb` over `time/push_s`, checkpoint engine + vLLM `load_weights` +
   CPU repack, unverified: `trainer.verify_push_every=0`) vs a single-stream memcpy (`dst.copy_(src)`, 1 torch
   thread) of the same number of bytes in this process;
5. rollout tokens/s: vLLM (the RL run's engine settings) vs transformers `generate`, same chat prompts, greedy,
   exactly `--new-tokens` tokens each (benchmarks/rollout.py's `measure_generation`, in a child process).

`colocated_over_sum` = colocated peak / (trainer alone + engine alone); the table under it says where the excess is.
Prints markdown tables, then exactly one JSON line (the first model's figures at the top level, each other model's
under its flavor name; scale.json in `--out` also has the per-process memory details):
{"model": "qwen2-0.5b", "params": .., "trainer_peak_gib": .., "engine_peak_gib": .., "colocated_peak_gib": ..,
 "colocated_over_sum": .., "push_gb_s": .., "memcpy_gb_s": .., "push_ratio_vs_memcpy": .., "rollout_speedup_vs_hf": ..,
 "times_s": {..}, ..., "tiny_k2": {...}}
Heavy outputs (checkpoints, final/ models) are deleted after each model unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GIB = 2**30
SAMPLE_INTERVAL_S = 0.25
PSS_EVERY = 8  # ticks between PSS readings (smaps_rollup walks every page table: too slow for each tick)
ENGINE = {"dtype": "float32", "max_model_len": 2048, "max_num_seqs": 64, "kv_cache_gib": 1.0}  # `k2post eval`'s
# Ray's own processes (lower case; the agents are `ray::DashboardAgent`, `ray::RuntimeEnvAgent`)
RAY_INFRA = (
    "gcs_server",
    "raylet",
    "log_monitor",
    "dashboard",
    "runtime_env",
    "runtimeenvagent",
    "monitor.py",
    "ray_client_server",
)


# --------------------------------------------------------------------------- process-tree memory


def role_of(cmdline: list[str], is_root: bool) -> str:
    """The role of a process of a run's tree from its command line (Ray actors set theirs to `ray::Class...`)."""
    text = " ".join(cmdline)
    if is_root:
        return "driver"
    if "ray::RLTrainerWorker" in text:
        return "trainer"
    if "ray::RolloutWorker" in text:
        return "rollout"
    if "ray::IDLE" in text or "default_worker.py" in text:
        return "ray_idle_worker"
    if any(name in text.lower() for name in RAY_INFRA):
        return "ray_infra"
    if text.startswith("ray::"):
        return "ray_other_worker"
    if "multiprocessing" in text:
        return "worker_pool"
    return "other"


STATUS_FIELDS = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem", "VmHWM": "hwm"}
KINDS = ("anon", "file", "shmem")  # RSS = anonymous (heap, tensors) + file-backed (libraries, mmapped weights) + shm


def read_status(pid: int) -> dict[str, int]:
    """RSS now (`rss`) split into `anon` / `file` / `shmem`, and the peak RSS (`hwm`), in bytes, from
    `/proc/PID/status`; {} if the process is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in STATUS_FIELDS:
                    out[STATUS_FIELDS[key]] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def read_pss(pid: int) -> int:
    """Proportional set size (bytes) from `/proc/PID/smaps_rollup`; 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


@dataclass
class TreeMemory:
    """What a sampled process tree used: peak of the summed RSS, and at that instant its split by role and by kind
    (anon / file / shmem); the peak of the summed PSS; each process's own peak (VmHWM) summed per role. Bytes."""

    peak_rss: int = 0
    peak_rss_roles: dict[str, int] = field(default_factory=dict)
    peak_rss_kinds: dict[str, int] = field(default_factory=dict)
    peak_pss: int = 0
    hwm_roles: dict[str, int] = field(default_factory=dict)
    processes: int = 0
    samples: int = 0

    def add_sample(self, procs: dict[int, tuple[str, dict[str, int]]], pss_total: int | None) -> None:
        """One sample: pid -> (role, `read_status` fields), and the summed PSS when it was read this tick."""
        self.samples += 1
        total = sum(status.get("rss", 0) for _, status in procs.values())
        if total > self.peak_rss:
            self.peak_rss = total
            roles: dict[str, int] = {}
            for role, status in procs.values():
                roles[role] = roles.get(role, 0) + status.get("rss", 0)
            self.peak_rss_roles = roles
            self.peak_rss_kinds = {kind: sum(status.get(kind, 0) for _, status in procs.values()) for kind in KINDS}
        if pss_total is not None:
            self.peak_pss = max(self.peak_pss, pss_total)

    def finish(self, hwm_by_pid: dict[int, tuple[str, int]]) -> None:
        """Per-process peaks (the last VmHWM seen of every process that ever ran) summed per role."""
        self.processes = len(hwm_by_pid)
        roles: dict[str, int] = {}
        for role, hwm in hwm_by_pid.values():
            roles[role] = roles.get(role, 0) + hwm
        self.hwm_roles = roles

    def to_json(self) -> dict[str, Any]:
        return {
            "peak_gib": gib(self.peak_rss),
            "peak_pss_gib": gib(self.peak_pss),
            "peak_by_role_gib": {k: gib(v) for k, v in sorted(self.peak_rss_roles.items())},
            "peak_by_kind_gib": {k: gib(v) for k, v in self.peak_rss_kinds.items()},
            "hwm_by_role_gib": {k: gib(v) for k, v in sorted(self.hwm_roles.items())},
            "hwm_sum_gib": gib(sum(self.hwm_roles.values())),
            "processes": self.processes,
            "samples": self.samples,
        }


def gib(nbytes: float) -> float:
    return round(nbytes / GIB, 3)


class TreeSampler:
    """Samples the memory of `root_pid` and all its descendants every `interval` s in a thread (psutil finds the
    descendants, /proc/PID/status gives each one's RSS split and peak; PSS every `pss_every` ticks)."""

    def __init__(self, root_pid: int, interval: float = SAMPLE_INTERVAL_S, pss_every: int = PSS_EVERY) -> None:
        self.root_pid, self.interval, self.pss_every = root_pid, interval, pss_every
        self.memory = TreeMemory()
        self._hwm: dict[int, tuple[str, int]] = {}
        self._roles: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.memory.finish(self._hwm)

    def _tree(self) -> list[Any]:
        import psutil

        try:
            root = psutil.Process(self.root_pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _role(self, proc: Any) -> str:
        """A process's role, read once (a Ray worker renames itself when it becomes an actor: re-read while idle)."""
        import psutil

        role = self._roles.get(proc.pid)
        if role is None or role in ("ray_idle_worker", "other"):
            try:
                role = role_of(proc.cmdline(), proc.pid == self.root_pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                role = role or "other"
            self._roles[proc.pid] = role
        return role

    def sample(self, with_pss: bool = False) -> None:
        procs: dict[int, tuple[str, dict[str, int]]] = {}
        pss = 0
        for proc in self._tree():
            status = read_status(proc.pid)
            if not status:
                continue
            role = self._role(proc)
            procs[proc.pid] = (role, status)
            self._hwm[proc.pid] = (role, max(status.get("hwm", 0), self._hwm.get(proc.pid, (role, 0))[1]))
            if with_pss:
                pss += read_pss(proc.pid)
        if procs:
            self.memory.add_sample(procs, pss if with_pss else None)

    def _loop(self) -> None:
        tick = 0
        while not self._stop.is_set():
            self.sample(with_pss=tick % self.pss_every == 0)
            tick += 1
            self._stop.wait(self.interval)


def run_sampled(
    command: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    interval: float = SAMPLE_INTERVAL_S,
    pss_every: int = PSS_EVERY,
) -> tuple[float, TreeMemory]:
    """Run `command` from the repo root (output to `log`) with its process tree sampled; (seconds, memory).
    SystemExit with the log's tail when it fails."""
    started = time.perf_counter()
    with open(log, "w") as handle:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=env)
        with TreeSampler(proc.pid, interval, pss_every) as sampler:
            status = proc.wait()
    if status != 0:
        raise SystemExit(f"{' '.join(command[2:5])} failed (exit {status}):\n{log.read_text()[-4000:]}")
    return time.perf_counter() - started, sampler.memory


def k2post(*args: str) -> list[str]:
    return [sys.executable, "-m", "k2post.cli", *args]


# --------------------------------------------------------------------------- configs of the runs


def write_sft_data(path: Path, rows: int) -> Path:
    """`rows` short arithmetic chats as JSONL (k2post's `messages` column)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        for i in range(rows):
            a, b = 3 + 7 * i % 89, 11 + 13 * i % 97
            messages = [
                {"role": "user", "content": f"What is {a} + {b}? Put your final answer in \\boxed{{}}."},
                {"role": "assistant", "content": f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."},
            ]
            handle.write(json.dumps({"messages": messages}) + "\n")
    return path


def sft_config(model_dir: Path, data: Path, run_dir: Path, seq_len: int, zero_stage: int) -> dict[str, Any]:
    """One optimizer step on one packed row of `seq_len` tokens: the trainer alone (fp32, the RL rank's ZeRO stage)."""
    return {
        "kind": "sft",
        "run_dir": str(run_dir),
        "model": {"path": str(model_dir), "flavor": None},
        "data": {"path": str(data), "max_seq_len": seq_len, "packing": True, "eval_fraction": 0.0},
        "train": {"max_steps": 1, "micro_batch_size": 1, "eval_every": 0, "eval_at_start": False, "log_every": 1},
        "schedule": {"kind": "constant", "warmup_steps": 0},
        "checkpoint": {"every": 0, "keep": 1},
        "deepspeed": {"zero_stage": zero_stage, "precision": "fp32"},
    }


def rl_config(model_dir: Path, run_dir: Path, ray_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One iteration, one optimizer step on every episode, before/after evals of `eval_n` tasks, eval's engine."""
    groups = args.prompts
    return {
        "kind": "rl",
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"path": str(model_dir), "flavor": None},
        "envs": [
            {"name": "math", "weight": 1.0, "config": {"difficulty": 1, "problem_types": ["add", "sub", "mul", "word"]}}
        ],
        "rollout": {
            "prompts_per_iteration": args.prompts,
            "samples_per_prompt": args.samples,
            "engine": dict(ENGINE),
            "sleep_during_training": False,
        },
        "loss": {
            "groups_per_step": groups,
            "micro_batch_size": args.micro_batch,
            "max_steps_per_iteration": 1,
            "drop_uniform_groups": False,  # a random model's rewards are all 0: keep the groups, take the step
        },
        "budget": {"default_max_tokens": args.max_tokens, "penalty": "none"},
        "trainer": {"world_size": 1, "zero_stage": args.zero_stage, "verify_push_every": 0},
        "train": {
            "iterations": 1,
            "prompt_pool_per_env": 64,
            "eval_every": 0,
            "eval_tasks_per_env": args.eval_n,
            "plots": False,
        },
        "checkpoint": {"every": 0, "keep": 1},
        "reward": {"workers": 1, "timeout_s": 10.0},
        "ray": {"num_cpus": 2, "cpus_per_bundle": 2, "temp_dir": str(ray_dir)},
    }


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def last_metrics_row(path: Path, key: str) -> dict[str, Any]:
    """The last metrics.jsonl row that has `key`."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    matching = [r for r in rows if key in r]
    if not matching:
        raise SystemExit(f"{path}: no row with {key!r}")
    return matching[-1]


def rl_phase_times(row: dict[str, Any]) -> dict[str, float]:
    """The iteration's `time/<phase>_s` metrics as {phase: seconds} (push_digest and the trainer's own step time,
    which are parts of other phases, left out)."""
    skip = {"time/push_digest_s", "time/trainer_step_s"}
    return {
        key.removeprefix("time/").removesuffix("_s"): round(float(value), 3)
        for key, value in row.items()
        if key.startswith("time/") and key.endswith("_s") and key not in skip
    }


# --------------------------------------------------------------------------- push vs memcpy, rollout vs HF


def memcpy_gbps(nbytes: int, repeats: int = 3) -> float:
    """GB/s of one `dst.copy_(src)` of `nbytes` (fp32) with 1 torch thread: a single copy stream; median of
    `repeats` after a warm-up (which also faults in dst's pages)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.rand(max(nbytes // 4, 1))
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
        return src.numel() * 4 / statistics.median(times) / 1e9
    finally:
        torch.set_num_threads(threads)


def rollout_child(model_dir: str, n_prompts: int, new_tokens: int, repeats: int) -> None:
    """(In a child process) vLLM with the RL run's engine settings vs transformers generate; one JSON line."""
    from benchmarks.rollout import chat_prompts, generation_figures, measure_generation
    from k2post.models.loading import load_causal_lm, load_tokenizer
    from k2post.rollout.config import VLLMEngineConfig
    from k2post.rollout.vllm_engine import VLLMEngine

    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    engine = VLLMEngine(model_dir, VLLMEngineConfig(**ENGINE))
    try:
        prompts = chat_prompts(tokenizer, n_prompts)
        gen = measure_generation(engine, model, tokenizer, prompts, new_tokens, repeats)
    finally:
        engine.close()
    figures = generation_figures(gen, n_prompts, new_tokens)
    print(json.dumps({**figures, "prompt_tokens_mean": sum(map(len, prompts)) / len(prompts)}), flush=True)


def rollout_compare(model_dir: Path, log: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--rollout-child", str(model_dir)]
    cmd += ["--rollout-size", f"{args.rollout_prompts}x{args.new_tokens}", "--repeats", str(args.repeats)]
    seconds, memory = run_sampled(cmd, log)
    figures = json.loads(log.read_text().strip().splitlines()[-1])
    return {**figures, "size": f"{args.rollout_prompts}x{args.new_tokens}", "seconds": round(seconds, 1)}


# --------------------------------------------------------------------------- one model


def count_params_of(model_dir: Path) -> int:
    """Parameters of a model dir, counted on the meta device from its config.json (tied weights once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def excess_split(trainer: TreeMemory, engine: TreeMemory, colocated: TreeMemory) -> dict[str, float]:
    """Where the colocated peak differs from trainer alone + engine alone, in GiB, by role (at the colocated peak):
    the trainer actor vs the whole SFT tree, the rollout actor vs the whole eval tree, and what only the Ray run has
    (driver, Ray's own processes, idle workers, reward workers). `*_own_peak_*`: the same two comparisons with each
    process's own peak (VmHWM: exact, where the 0.25 s samples can miss a short spike; the two actors need not peak
    at the same instant). Pure: tested on hand-made figures."""
    roles = colocated.peak_rss_roles
    out = {
        "trainer_actor_minus_sft": gib(roles.get("trainer", 0) - trainer.peak_rss),
        "rollout_actor_minus_eval": gib(roles.get("rollout", 0) - engine.peak_rss),
        "trainer_actor_own_peak_minus_sft": gib(
            colocated.hwm_roles.get("trainer", 0) - trainer.hwm_roles.get("driver", 0)
        ),
        "rollout_actor_own_peak_minus_eval": gib(
            colocated.hwm_roles.get("rollout", 0) - engine.hwm_roles.get("driver", 0)
        ),
    }
    for role in ("driver", "ray_infra", "ray_idle_worker", "ray_other_worker", "worker_pool", "other"):
        if roles.get(role):
            out[role] = gib(roles[role])
    out["total_excess"] = gib(colocated.peak_rss - trainer.peak_rss - engine.peak_rss)
    return out


def run_model(flavor: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Build, SFT step, eval, RL iteration, rollout compare and memcpy for one flavor; its figures."""
    work = out / flavor
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    model_dir = work / "model"
    times: dict[str, float] = {}
    if not (model_dir / "config.json").is_file():
        times["init"], _ = run_sampled(
            k2post("model", "init", "--flavor", flavor, "--out", str(model_dir)), logs / "init.log"
        )
    params = count_params_of(model_dir)
    print(f"[scale] {flavor}: {params:,} params, model at {model_dir}", flush=True)

    data = write_sft_data(work / "sft_data.jsonl", args.sft_rows)
    trainers: dict[int, TreeMemory] = {}
    for stage in dict.fromkeys([args.zero_stage, *args.also_zero]):  # the RL run's stage first
        name = "sft" if stage == args.zero_stage else f"sft_zero{stage}"
        config = sft_config(model_dir, data, work / name, args.sft_seq_len, stage)
        shutil.rmtree(work / name, ignore_errors=True)
        sft_s, trainers[stage] = run_sampled(
            k2post("sft", str(write_yaml(work / f"{name}.yaml", config))), logs / f"{name}.log"
        )
        sft_row = last_metrics_row(work / name / "metrics.jsonl", "step_time_s")
        times |= {f"{name}_wall": sft_s, f"{name}_step": sft_row["step_time_s"]}
        peak = trainers[stage].peak_rss / GIB
        print(f"[scale] {flavor}: trainer alone (ZeRO-{stage}) {peak:.2f} GiB, {sft_s:.0f} s", flush=True)
        if not args.keep:
            shutil.rmtree(work / name / "checkpoints", ignore_errors=True)
            shutil.rmtree(work / name / "final", ignore_errors=True)
    trainer = trainers[args.zero_stage]

    report = work / "eval.json"
    eval_cmd = k2post("eval", str(model_dir), "--env", "math", "--n", str(args.eval_n), "--out", str(report))
    eval_s, engine = run_sampled([*eval_cmd, "--max-tokens", str(args.max_tokens)], logs / "eval.log")
    times["eval_wall"] = eval_s
    print(f"[scale] {flavor}: engine alone {engine.peak_rss / GIB:.2f} GiB, {eval_s:.0f} s", flush=True)

    ray_dir = Path(tempfile.mkdtemp(prefix="k2r-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    rl_yaml = write_yaml(work / "rl.yaml", rl_config(model_dir, work / "rl", ray_dir, args))
    shutil.rmtree(work / "rl", ignore_errors=True)
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    try:
        rl_s, colocated = run_sampled(k2post("rl", str(rl_yaml)), logs / "rl.log", env=env)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    row = last_metrics_row(work / "rl" / "metrics.jsonl", "time/push_s")
    summary = json.loads((work / "rl" / "summary.json").read_text())
    phases = rl_phase_times(row)
    times |= {"rl_wall": rl_s, "rl_run": summary.get("wall_s", 0.0)}
    print(f"[scale] {flavor}: colocated {colocated.peak_rss / GIB:.2f} GiB, {rl_s:.0f} s", flush=True)

    push_bytes = int(row["push/mb"] * 2**20)
    push_gbps = push_bytes / row["time/push_s"] / 1e9
    copy_gbps = memcpy_gbps(push_bytes)
    rollout = rollout_compare(model_dir, logs / "rollout.log", args)
    times["rollout_compare_wall"] = rollout["seconds"]

    if not args.keep:
        shutil.rmtree(work / "rl" / "checkpoints", ignore_errors=True)
        shutil.rmtree(work / "rl" / "final", ignore_errors=True)
    both = trainer.peak_rss + engine.peak_rss
    return {
        "model": flavor,
        "params": params,
        "zero_stage": args.zero_stage,
        "trainer_peak_gib": round(trainer.peak_rss / GIB, 3),
        **{f"trainer_zero{k}_peak_gib": gib(m.peak_rss) for k, m in trainers.items() if k != args.zero_stage},
        "engine_peak_gib": round(engine.peak_rss / GIB, 3),
        "colocated_peak_gib": round(colocated.peak_rss / GIB, 3),
        "colocated_over_sum": round(colocated.peak_rss / both, 3),
        "colocated_pss_over_sum": round(colocated.peak_pss / max(trainer.peak_pss + engine.peak_pss, 1), 3),
        "push_gb_s": round(push_gbps, 3),
        "memcpy_gb_s": round(copy_gbps, 3),
        "push_ratio_vs_memcpy": round(push_gbps / copy_gbps, 4),
        "push_mb": round(row["push/mb"], 1),
        "rollout_speedup_vs_hf": rollout["speedup"],
        "rollout": rollout,
        "rl_phases_s": phases,
        "rl_memory_metrics_mib": {k.removeprefix("memory/"): round(v, 1) for k, v in row.items() if "memory/" in k},
        "times_s": {k: round(v, 2) for k, v in times.items()},
        "excess_gib": excess_split(trainer, engine, colocated),
        "memory": {
            "trainer": trainer.to_json(),
            "engine": engine.to_json(),
            "colocated": colocated.to_json(),
            **{f"trainer_zero{k}": m.to_json() for k, m in trainers.items() if k != args.zero_stage},
        },
    }


# --------------------------------------------------------------------------- report


def headline(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON line: the first model's figures at the top, each other model's under its name ('-'/'.' -> '_');
    the per-process memory details stay in scale.json."""
    out = {key: value for key, value in results[0].items() if key != "memory"}
    for result in results[1:]:
        out[result["model"].replace("-", "_").replace(".", "_")] = {k: v for k, v in result.items() if k != "memory"}
    return out


def print_tables(results: list[dict[str, Any]]) -> None:
    print(
        "\n| model | params | trainer alone GiB | engine alone GiB | colocated GiB | colocated / sum | PSS ratio "
        "| push GB/s | memcpy GB/s | push / memcpy | vLLM tok/s | HF tok/s | vLLM / HF |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        ro = r["rollout"]
        print(
            f"| {r['model']} | {r['params'] / 1e6:.1f} M | {r['trainer_peak_gib']:.2f} | {r['engine_peak_gib']:.2f} "
            f"| {r['colocated_peak_gib']:.2f} | {r['colocated_over_sum']:.2f} | {r['colocated_pss_over_sum']:.2f} "
            f"| {r['push_gb_s']:.2f} | {r['memcpy_gb_s']:.2f} | {r['push_ratio_vs_memcpy']:.3f} "
            f"| {ro['vllm_tok_s']:.0f} | {ro['hf_tok_s']:.0f} | {r['rollout_speedup_vs_hf']:.2f}x |"
        )
    print("\nTime per phase (s): the SFT step, the RL iteration's own `time/*` metrics, the commands' wall time")
    for r in results:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r["rl_phases_s"].items())
        walls = ", ".join(f"{k} {v:.1f}" for k, v in r["times_s"].items())
        print(f"- {r['model']}: RL iteration: {phases}; {walls}")
    print("\nMemory at each run's peak (GiB): by kind (anon / file-backed / shm) and, colocated, by process role; each")
    print("process's own peak (VmHWM) summed per role; where the colocated peak exceeds trainer alone + engine alone")
    for r in results:
        for run, mem in r["memory"].items():
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in mem["peak_by_kind_gib"].items())
            roles = ", ".join(f"{k} {v:.2f}" for k, v in mem["peak_by_role_gib"].items())
            hwm = ", ".join(f"{k} {v:.2f}" for k, v in mem["hwm_by_role_gib"].items())
            print(
                f"- {r['model']} {run}: peak {mem['peak_gib']:.2f} (PSS {mem['peak_pss_gib']:.2f}); {kinds}; ", end=""
            )
            print(f"roles: {roles}; own peaks: {hwm}")
        print(f"- {r['model']} excess over the sum: {r['excess_gib']}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["qwen2-0.5b", "tiny-k2"], help="flavors to run, in order")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "scale", help="work dir (models, runs, logs)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints and final/ models of the runs")
    parser.add_argument(
        "--zero-stage",
        type=int,
        default=0,
        choices=(0, 1, 2),
        help="ZeRO stage of the trainer in SFT and RL (default 0: one rank has nothing to shard, and ZeRO-1/2's "
        "fp32 partition copy and gradient buckets add ~3x the weights; see --also-zero)",
    )
    parser.add_argument(
        "--also-zero",
        type=int,
        nargs="*",
        default=[],
        choices=(0, 1, 2),
        help="also measure the trainer alone (one SFT step) at these ZeRO stages",
    )
    parser.add_argument("--sft-seq-len", type=int, default=512, help="tokens in the SFT step's packed row")
    parser.add_argument("--sft-rows", type=int, default=64, help="chats in the generated SFT set")
    parser.add_argument("--prompts", type=int, default=2, help="RL prompts (groups) in the iteration")
    parser.add_argument("--samples", type=int, default=4, help="RL samples per prompt (K)")
    parser.add_argument("--micro-batch", type=int, default=4, help="RL sequences per trainer micro-batch")
    parser.add_argument("--max-tokens", type=int, default=32, help="token budget of RL and eval responses")
    parser.add_argument("--eval-n", type=int, default=4, help="tasks of `k2post eval` and of the RL run's evals")
    parser.add_argument("--rollout-prompts", type=int, default=8, help="prompts of the vLLM vs HF comparison")
    parser.add_argument("--new-tokens", type=int, default=32, help="new tokens per prompt in the comparison")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each generator in the comparison")
    parser.add_argument("--smoke", action="store_true", help="tiny-qwen2 only, the smallest sizes (tests)")
    parser.add_argument("--rollout-child", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--rollout-size", default="8x32", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rollout_child:
        n_prompts, new_tokens = (int(x) for x in args.rollout_size.split("x"))
        rollout_child(args.rollout_child, n_prompts, new_tokens, args.repeats)
        return 0
    if args.smoke:
        args.models, args.sft_seq_len, args.sft_rows, args.eval_n = (
            ["tiny-qwen2"],
            128,
            8,
            2,
        )  # a row is ~72 tokens with K2's default system message
        args.prompts, args.samples, args.max_tokens, args.rollout_prompts, args.new_tokens = 2, 2, 4, 2, 4
    started = time.perf_counter()
    results = [run_model(flavor, args.out.absolute(), args) for flavor in args.models]
    print_tables(results)
    figures = headline(results)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    (args.out / "scale.json").write_text(json.dumps({**figures, "runs": results}, indent=2) + "\n")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
