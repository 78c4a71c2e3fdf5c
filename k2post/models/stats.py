"""Model stats: what a causal LM costs, counted from the model itself.

    k2post model stats artifacts/models/tiny-k2               # an HF model dir (its config.json)
    k2post model stats path/to/config.json --json             # a config.json; one JSON object
    k2post model stats --preset kimi-k2 [--context 8192] [--kv-dtype fp8]
    stats = model_stats(preset_config("deepseek-v3"), context=4096)          # the same, as a dict

The model is built from its config on the meta device (`torch.device("meta")`: shapes, no memory, no
init work), so a 1T-parameter config costs a few seconds and every count is that module tree's own
`parameters()` — no formula. Figures (docs/MODELS.md, "Model stats"):

- total params: `sum(p.numel())` over the built model (tied embeddings once; buffers such as
  DeepSeek-V3's `e_score_correction_bias` are not parameters in transformers 5.x and are not counted).
- breakdown: every parameter in exactly one category, by its name in the module tree — embeddings (the
  input embedding), head (the untied lm_head), norms (any `*norm*` module, including MLA's q_a / kv_a
  layernorms, and anything no other category claims), routed experts (under an `experts` module), shared
  experts (under `shared_experts` / `shared_expert`), router (`gate` / `router` modules and
  `e_score_correction_bias` where it is a parameter), attention (under `self_attn` / `attn` /
  `attention`), dense MLP (under `mlp` / `feed_forward`, not MoE). The categories sum to the total.
- active params per token: every parameter except the routed experts, plus the routed experts x
  num_experts_per_tok / n_routed_experts (each token runs k of the E experts of every MoE layer).
- forward FLOPs per token at context L (one token's forward pass, multiply-add = 2 FLOPs):
  matrix = 2 x the active matmul weights: every active parameter of 2+ dims except the input embedding
  (a lookup, no FLOPs), plus the output head once even when it is tied to the input embedding; biases,
  norms and elementwise work are left out. attention = the score work of a token that attends to L
  keys: 2 x layers x heads x L x (d_qk + d_v) (QK^T and AV, 2 FLOPs per multiply-add), d_qk = d_v =
  head_dim for MHA / GQA, d_qk = qk_nope + qk_rope and d_v = v_head_dim for MLA (uncompressed MLA, as in
  training and prefill). L is the full context, not a causal average: it is the token at position L (a
  decode step at context L; the PaLM / Megatron MFU convention). A training sequence of n tokens
  averages (n + 1) / 2 keys per token: pass that (`causal_context`) to count a step's useful work.
  Training = 3 x forward (backward = 2 x forward).
- KV-cache bytes per token: MHA / GQA 2 x kv_heads x head_dim x layers x bytes; MLA (DeepSeek-V3 / K2)
  (kv_lora_rank + qk_rope_head_dim) x layers x bytes, the latent vLLM's MLA backends cache.
- what-if double heads: num_attention_heads x 2 with everything else kept (head dims, GQA KV heads; MLA
  has one KV head per query head, so they double too), rebuilt on the meta device, and the deltas.

A config.json is read as user input: absurd size values (`hidden_size: 1e12`, 0 heads, a negative vocabulary, a
string) are one line before anything is built (k2post/models/config_check.py), and whatever transformers still
refuses while building is one line too; `context` is at most MAX_CONTEXT.

Presets: `kimi-k2` and `deepseek-v3` (their published configs, no MTP layer) and the repo's tiny
flavors at the default tokenizer's 4096-row vocabulary (`k2post model init --vocab-size`).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from k2post.models.config_check import check_model_config, read_config_json

if TYPE_CHECKING:  # torch and transformers load only when a model is built (a typo is reported in well under 1 s)
    import torch
    from transformers import PretrainedConfig

DEFAULT_CONTEXT = 4096
MAX_CONTEXT = 1 << 30  # keys one token attends to; 1B is far past any model's window
FLAVOR_VOCAB = 4096  # the default tokenizer's size (k2post model init --vocab-size), a multiple of 64
KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4, "fp8": 1}
CATEGORIES = ("attention", "routed_experts", "shared_experts", "dense_mlp", "router", "embeddings", "head", "norms")
ATTENTION_MODULES = frozenset({"self_attn", "attn", "attention", "self_attention"})
MLP_MODULES = frozenset({"mlp", "feed_forward", "block_sparse_moe", "ffn"})
ROUTER_MODULES = frozenset({"gate", "router", "shared_expert_gate"})
SHARED_MODULES = frozenset({"shared_experts", "shared_expert"})


# --------------------------------------------------------------------------- configs


def kimi_k2_config() -> PretrainedConfig:
    """Kimi K2 (DeepSeek-V3 architecture): 61 layers, 64 heads, 384 routed experts (8 active) + 1 shared."""
    return _deepseek_v3(heads=64, experts=384, dense_layers=1, vocab=163840, n_group=1, topk_group=1)


def deepseek_v3_config() -> PretrainedConfig:
    """DeepSeek-V3 (without its MTP layer): 61 layers, 128 heads, 256 routed experts (8 active) + 1 shared."""
    return _deepseek_v3(heads=128, experts=256, dense_layers=3, vocab=129280, n_group=8, topk_group=4)


def _deepseek_v3(heads: int, experts: int, dense_layers: int, vocab: int, n_group: int, topk_group: int) -> Any:
    """The shared shape of K2 and DeepSeek-V3 (hidden 7168, MLA q_lora 1536 / kv_lora 512, nope 128 / rope 64)."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=vocab,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=61,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        n_shared_experts=1,
        n_routed_experts=experts,
        num_experts_per_tok=8,
        first_k_dense_replace=dense_layers,
        n_group=n_group,
        topk_group=topk_group,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        tie_word_embeddings=False,
    )


PRESETS: dict[str, Callable[[], Any]] = {"kimi-k2": kimi_k2_config, "deepseek-v3": deepseek_v3_config}


def known_presets() -> list[str]:
    """The published presets, then the repo's flavors."""
    from k2post.models.flavors import known_flavors

    return [*PRESETS, *known_flavors()]


def preset_config(name: str) -> PretrainedConfig:
    """The HF config of preset `name` (a published model or a tiny flavor at vocab 4096); KeyError if unknown."""
    from k2post.models.flavors import FLAVORS, flavor_config

    if name in PRESETS:
        return PRESETS[name]()
    if name in FLAVORS:
        return flavor_config(name, FLAVOR_VOCAB)
    raise KeyError(f"unknown preset {name!r}; known presets: {', '.join(known_presets())}")


def load_config(path: str | Path) -> PretrainedConfig:
    """The HF config of a model dir (its config.json) or of a config.json file; one-line errors."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such model dir or config.json")
    if not file.is_file():
        raise FileNotFoundError(f"{path}: not an HF model dir (no config.json)")
    raw = read_config_json(file)
    if not raw.get("model_type"):
        raise ValueError(f"{file}: no model_type (not an HF model config)")
    check_model_config(raw, str(file))
    from transformers import CONFIG_MAPPING

    model_type = known_model_type(raw)
    if model_type is None:
        raise ValueError(f"{file}: unknown architecture (model_type {raw['model_type']!r} is not in transformers)")
    try:
        return CONFIG_MAPPING[model_type].from_dict({**raw, "model_type": model_type})
    except Exception as err:  # noqa: BLE001 (user input: any refusal of transformers is a bad config, one line)
        raise ValueError(f"{file}: not a valid {model_type} config ({_first_line(err)})") from None


def known_model_type(raw: dict[str, Any]) -> str | None:
    """The transformers model_type of a config.json: its own, or the one whose causal LM its `architectures`
    names (a remote-code config such as K2's `kimi_k2` with `DeepseekV3ForCausalLM`); None if neither."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if raw["model_type"] in CONFIG_MAPPING:
        return raw["model_type"]
    by_class = {name: model_type for model_type, name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}
    return next((by_class[a] for a in raw.get("architectures") or [] if a in by_class), None)


def _first_line(err: BaseException) -> str:
    """The first line of an error's message (its type name when it has none)."""
    return str(err).splitlines()[0] if str(err) else type(err).__name__


# --------------------------------------------------------------------------- the meta model


def meta_model(config: PretrainedConfig) -> torch.nn.Module:
    """The causal LM of `config` built on the meta device (parameter shapes only); ValueError if it has none."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError) as err:
        if "Unrecognized configuration class" in str(err):
            raise ValueError(f"unknown architecture: transformers has no causal LM for {config.model_type!r}") from None
        raise ValueError(f"cannot build a {config.model_type!r} model from this config: {_first_line(err)}") from None
    except Exception as err:  # noqa: BLE001 (ZeroDivisionError, RuntimeError, ... of a config no check caught)
        raise ValueError(f"cannot build a {config.model_type!r} model from this config: {_first_line(err)}") from None


def expert_ratio(config: PretrainedConfig) -> tuple[int, int]:
    """(experts each token uses, routed experts per MoE layer); (1, 1) for a dense model."""
    total = next(
        (
            getattr(config, key)
            for key in ("n_routed_experts", "num_local_experts", "num_experts")
            if getattr(config, key, None)
        ),
        None,
    )
    used = getattr(config, "num_experts_per_tok", None)
    return (int(used), int(total)) if total and used else (1, 1)


def category(name: str, param: Any, model: torch.nn.Module) -> str:
    """The breakdown category of parameter `name` (see the module docstring)."""
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if param is embedding.weight:
        return "embeddings"
    if head is not None and param is head.weight:
        return "head"
    parts = name.split(".")
    if any("norm" in part for part in parts):
        return "norms"
    if SHARED_MODULES & set(parts):
        return "shared_experts"
    if "experts" in parts:
        return "routed_experts"
    if ROUTER_MODULES & set(parts) or parts[-1] == "e_score_correction_bias":
        return "router"
    if ATTENTION_MODULES & set(parts):
        return "attention"
    return "dense_mlp" if MLP_MODULES & set(parts) else "norms"


def numel(param: Any) -> int:
    """Elements of a parameter (its full size under ZeRO-3, where the local tensor is a shard)."""
    return int(getattr(param, "ds_numel", param.numel()))


def param_breakdown(model: torch.nn.Module) -> dict[str, int]:
    """Parameters per category (each tied tensor once); the values sum to the model's total."""
    out = dict.fromkeys(CATEGORIES, 0)
    for name, param in model.named_parameters():
        out[category(name, param, model)] += numel(param)
    return out


def active_params(breakdown: dict[str, int], config: PretrainedConfig) -> int:
    """Parameters one token runs through: all but the routed experts, plus k / E of them."""
    used, total = expert_ratio(config)
    return sum(breakdown.values()) - breakdown["routed_experts"] + breakdown["routed_experts"] * used // total


# --------------------------------------------------------------------------- FLOPs and KV cache


def matrix_flops_per_token(model: torch.nn.Module) -> int:
    """Forward matmul FLOPs per token: 2 x active weights of 2+ dims, no input embedding, the head once."""
    used, total = expert_ratio(model.config)
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    weights = 0
    for name, param in model.named_parameters():
        if param is embedding.weight or len(getattr(param, "ds_shape", param.shape)) < 2:
            continue
        share = numel(param) * used // total if category(name, param, model) == "routed_experts" else numel(param)
        weights += share
    if head is not None and head.weight is embedding.weight:  # tied: the head's matmul still runs
        weights += numel(head.weight)
    return 2 * weights


def attention_dims(config: PretrainedConfig) -> tuple[int, int]:
    """(d_qk, d_v) of one attention head: MLA's nope + rope and v_head_dim, else head_dim for both."""
    if getattr(config, "kv_lora_rank", None):
        return config.qk_nope_head_dim + config.qk_rope_head_dim, config.v_head_dim
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return head_dim, head_dim


def attention_flops_per_token(config: PretrainedConfig, context: float) -> float:
    """QK^T + AV FLOPs of one token attending to `context` keys in every layer (forward)."""
    d_qk, d_v = attention_dims(config)
    return 2.0 * config.num_hidden_layers * config.num_attention_heads * context * (d_qk + d_v)


def causal_context(lengths: list[int]) -> float:
    """Mean keys a token attends to over causal sequences of these lengths: sum n(n+1)/2 / sum n."""
    tokens = sum(lengths)
    return sum(n * (n + 1) / 2 for n in lengths) / tokens if tokens else 0.0


def kv_bytes_per_token(config: PretrainedConfig, dtype: str = "bf16") -> int:
    """KV-cache bytes one token holds over all layers: MLA's latent + rope key, else K and V of every KV head."""
    if dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {dtype!r}; one of: {', '.join(KV_DTYPE_BYTES)}")
    if getattr(config, "kv_lora_rank", None):
        per_layer = config.kv_lora_rank + config.qk_rope_head_dim
    else:
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        per_layer = 2 * kv_heads * attention_dims(config)[0]
    return per_layer * config.num_hidden_layers * KV_DTYPE_BYTES[dtype]


def flops_per_token(model: torch.nn.Module, context: float) -> dict[str, float]:
    """Forward FLOPs per token at `context` (matrix, attention, total) and training (3 x forward)."""
    matrix = matrix_flops_per_token(model)
    attention = attention_flops_per_token(model.config, context)
    forward = matrix + attention
    return {"context": context, "matrix": matrix, "attention": attention, "total": forward, "train": 3 * forward}


# --------------------------------------------------------------------------- the report


def core_stats(config: PretrainedConfig, context: float, kv_dtype: str) -> dict[str, Any]:
    """Counts, FLOPs and KV bytes of `config` from a fresh meta model (and how long building it took)."""
    started = time.perf_counter()
    model = meta_model(config)
    build_s = time.perf_counter() - started
    breakdown = param_breakdown(model)
    return {
        "architecture": type(model).__name__,
        "total_params": sum(breakdown.values()),
        "active_params": active_params(breakdown, config),
        "breakdown": breakdown,
        "flops_per_token": flops_per_token(model, context),
        "kv_bytes_per_token": kv_bytes_per_token(config, kv_dtype),
        "meta_build_s": round(build_s, 3),
    }


def double_heads(config: PretrainedConfig) -> PretrainedConfig:
    """`config` with twice the query heads, head dims and (GQA) KV heads unchanged; MLA's KV heads follow."""
    doubled = copy.deepcopy(config)
    if not getattr(config, "kv_lora_rank", None):
        doubled.head_dim = attention_dims(config)[0]  # keep it: a derived head_dim would halve
        doubled.num_key_value_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    else:
        doubled.num_key_value_heads = 2 * config.num_attention_heads
    doubled.num_attention_heads = 2 * config.num_attention_heads
    return doubled


def what_if_double_heads(config: PretrainedConfig, base: dict[str, Any], context: float, kv_dtype: str) -> dict:
    """The double-heads variant's figures and their deltas from `base`."""
    doubled = core_stats(double_heads(config), context, kv_dtype)
    flops, base_flops = doubled["flops_per_token"], base["flops_per_token"]
    delta = {key: doubled[key] - base[key] for key in ("total_params", "active_params", "kv_bytes_per_token")}
    delta["flops_per_token"] = {key: flops[key] - base_flops[key] for key in ("matrix", "attention", "total")}
    delta["flops_per_token_ratio"] = flops["total"] / base_flops["total"]
    keep = ("total_params", "active_params", "flops_per_token", "kv_bytes_per_token")
    return {"num_attention_heads": 2 * config.num_attention_heads, **{k: doubled[k] for k in keep}, "delta": delta}


def model_stats(config: PretrainedConfig, context: float = DEFAULT_CONTEXT, kv_dtype: str = "bf16") -> dict:
    """Every figure of `k2post model stats` for `config` (the `--json` object)."""
    if not 0 < context <= MAX_CONTEXT:
        raise ValueError(f"--context must be in (0, {MAX_CONTEXT:,}], got {context:,}")
    base = core_stats(config, context, kv_dtype)
    return {
        "model_type": config.model_type,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "experts_per_token": list(expert_ratio(config)),
        "kv_dtype": kv_dtype,
        **base,
        "what_if_double_heads": what_if_double_heads(config, base, context, kv_dtype),
    }


def human(value: float) -> str:
    """1.03T, 32.6B, 4.46M, 812.0K, 12."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{value:.0f}"


def render(stats: dict[str, Any], name: str) -> str:
    """The human-readable table of `k2post model stats`."""
    flops, what_if = stats["flops_per_token"], stats["what_if_double_heads"]
    used, total = stats["experts_per_token"]
    rows = [
        ("total params", human(stats["total_params"]), f"{stats['total_params']:,}"),
        (
            "active params / token",
            human(stats["active_params"]),
            f"{stats['active_params']:,} ({used}/{total} experts)",
        ),
        *((f"  {key}", human(value), f"{value:,}") for key, value in stats["breakdown"].items()),
        (f"forward FLOPs / token @ {flops['context']:g}", human(flops["total"]), "matrix + attention"),
        ("  matrix (2 x active matmul)", human(flops["matrix"]), f"{flops['matrix']:,.0f}"),
        ("  attention (QK^T + AV)", human(flops["attention"]), f"{flops['attention']:,.0f} (full context)"),
        ("train FLOPs / token", human(flops["train"]), "3 x forward"),
        (
            f"KV cache / token ({stats['kv_dtype']})",
            f"{stats['kv_bytes_per_token'] / 1024:.1f} KiB",
            f"{stats['kv_bytes_per_token']:,} bytes",
        ),
    ]
    delta = what_if["delta"]
    rows += [
        (f"what if heads x2 ({stats['num_attention_heads']} -> {what_if['num_attention_heads']})", "", ""),
        ("  total params", human(what_if["total_params"]), f"{delta['total_params']:+,}"),
        ("  active params / token", human(what_if["active_params"]), f"{delta['active_params']:+,}"),
        (
            "  forward FLOPs / token",
            human(what_if["flops_per_token"]["total"]),
            f"{delta['flops_per_token']['total']:+,.0f} (x{delta['flops_per_token_ratio']:.3f})",
        ),
        (
            "  KV cache / token",
            f"{what_if['kv_bytes_per_token'] / 1024:.1f} KiB",
            f"{delta['kv_bytes_per_token']:+,} bytes",
        ),
    ]
    width = max(len(row[0]) for row in rows)
    head = f"{name}: {stats['architecture']}, {stats['num_hidden_layers']} layers, {stats['num_attention_heads']} heads"
    return "\n".join([head, *(f"{a:<{width}}  {b:>9}  {c}".rstrip() for a, b, c in rows)]) + "\n"
