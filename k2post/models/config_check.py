"""Refuse absurd model config values before anything is built or allocated (no torch import).

A config.json is user input: `hidden_size: 1e12`, `num_attention_heads: 0`, `vocab_size: -5` or a string would
otherwise end in a ZeroDivisionError, a pydantic-style dump from transformers, a multi-terabyte allocation or a
meta build that never ends. `config_problem(raw)` reads the size fields of any HF causal-LM config.json (the names
Llama / Qwen / Mixtral / DeepSeek-V3 / GPT-2 use) and returns the first problem as one sentence, or None:

- every size field present must be an integer (not a bool, float or string) in its range (`SIZE_LIMITS`);
  a field that may be null (`NULLABLE`: transformers then derives it) may be null;
- the query heads must divide the hidden size when no `head_dim` is given, and the KV heads the query heads;
- experts per token must be at most the routed experts;
- layers x routed experts (the modules a meta build makes) at most `MAX_LAYER_EXPERTS`.

    problem = config_problem(json.loads(path.read_text()))     # "num_attention_heads must be ... got 0" or None
    check_model_config(raw, "path/config.json")               # ValueError naming the file and the field
    raw = read_config_json(Path("path/config.json"))           # ValueError / FileNotFoundError, one line
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# field -> (smallest, largest) allowed. The largest values are ~8-64x today's largest public models (Kimi K2:
# hidden 7168, 61 layers, 384 experts, vocab 163840): generous for a real config, refusing a typo's 1e12.
SIZE_LIMITS: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 1 << 18),
    "n_embd": (1, 1 << 18),
    "num_hidden_layers": (1, 4096),
    "n_layer": (1, 4096),
    "num_attention_heads": (1, 1 << 14),
    "n_head": (1, 1 << 14),
    "num_key_value_heads": (1, 1 << 14),
    "head_dim": (1, 1 << 14),
    "vocab_size": (1, 1 << 23),
    "intermediate_size": (1, 1 << 21),
    "n_inner": (1, 1 << 21),
    "moe_intermediate_size": (1, 1 << 21),
    "shared_expert_intermediate_size": (1, 1 << 21),
    "max_position_embeddings": (1, 1 << 27),
    "n_positions": (1, 1 << 27),
    "n_routed_experts": (1, 1 << 14),
    "num_local_experts": (1, 1 << 14),
    "num_experts": (1, 1 << 14),
    "num_experts_per_tok": (1, 1 << 14),
    "n_shared_experts": (0, 1 << 10),
    "first_k_dense_replace": (0, 4096),
    "n_group": (1, 1 << 14),
    "topk_group": (1, 1 << 14),
    "q_lora_rank": (1, 1 << 18),
    "kv_lora_rank": (1, 1 << 18),
    "qk_nope_head_dim": (1, 1 << 14),
    "qk_rope_head_dim": (0, 1 << 14),
    "v_head_dim": (1, 1 << 14),
}
NULLABLE = frozenset(
    {"head_dim", "num_key_value_heads", "n_inner", "q_lora_rank", "kv_lora_rank", "num_experts", "n_routed_experts"}
    | {"num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "n_group"}
    | {"topk_group", "first_k_dense_replace", "shared_expert_intermediate_size", "max_position_embeddings"}
)
MAX_LAYER_EXPERTS = 1 << 18  # layers x routed experts: Kimi K2 has 61 x 384 = 23,424
EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
MAX_CONFIG_BYTES = 16 << 20  # K2's config.json is 2 KiB


def field_problem(key: str, value: Any) -> str | None:
    """Why `value` is not a valid `key` (see SIZE_LIMITS), or None."""
    low, high = SIZE_LIMITS[key]
    if value is None:
        return None if key in NULLABLE else f"{key} must be an integer, got null"
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{key} must be an integer, got {type(value).__name__} {str(value)[:40]!r}"
    if not low <= value <= high:
        return f"{key} must be in [{low}, {high:,}], got {value:,}"
    return None


def _get(raw: dict[str, Any], *keys: str) -> int | None:
    """The first of `keys` that `raw` holds as a positive int."""
    return next((raw[k] for k in keys if isinstance(raw.get(k), int) and raw[k] > 0), None)


def shape_problem(raw: dict[str, Any]) -> str | None:
    """Why the (valid) size fields do not fit together, or None."""
    hidden, heads = _get(raw, "hidden_size", "n_embd"), _get(raw, "num_attention_heads", "n_head")
    kv_heads, experts = _get(raw, "num_key_value_heads"), _get(raw, *EXPERT_KEYS)
    if hidden and heads and not raw.get("head_dim") and not raw.get("kv_lora_rank") and hidden % heads:
        return f"num_attention_heads {heads} does not divide hidden_size {hidden} (and no head_dim is given)"
    if heads and kv_heads and heads % kv_heads:
        return f"num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}"
    used = _get(raw, "num_experts_per_tok")
    if experts and used and used > experts:
        return f"num_experts_per_tok {used} is more than the {experts} routed experts"
    layers = _get(raw, "num_hidden_layers", "n_layer") or 1
    if experts and layers * experts > MAX_LAYER_EXPERTS:
        return f"{layers} layers x {experts} experts is more than {MAX_LAYER_EXPERTS:,} expert blocks"
    return None


def config_problem(raw: Any) -> str | None:
    """The first problem of a config.json's size fields (one sentence), or None when they are plausible."""
    if not isinstance(raw, dict):
        return f"not a JSON object (a {type(raw).__name__})"
    for key in SIZE_LIMITS:
        if key in raw:
            problem = field_problem(key, raw[key])
            if problem:
                return problem
    return shape_problem(raw)


def check_model_config(raw: Any, where: str) -> None:
    """ValueError `<where>: <problem>` (one line) when `config_problem(raw)` finds one."""
    problem = config_problem(raw)
    if problem:
        raise ValueError(f"{where}: {problem}")


def read_config_json(file: Path) -> dict[str, Any]:
    """The JSON object in `file`; ValueError (one line naming it) for a huge, binary, deeply nested or non-object
    file, FileNotFoundError for a missing one."""
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no such config file")
    if file.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{file}: {file.stat().st_size:,} bytes is not a model config (at most {MAX_CONFIG_BYTES:,})")
    try:
        raw = json.loads(file.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{file}: not a JSON config ({str(err)[:120] or type(err).__name__})") from None
    except OSError as err:
        raise ValueError(f"{file}: cannot read it ({err.strerror or err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: not a JSON object (a {type(raw).__name__}), so not an HF model config")
    return raw
