"""Build a fresh model directory from a registered flavor: tokenizer + random weights.

`init_model_dir(flavor, out_dir, seed)` writes a complete HF model dir (config.json,
model.safetensors, generation_config.json, tokenizer files) that AutoModelForCausalLM,
AutoTokenizer and vLLM can load. The directory appears atomically: everything is written
into a temp dir next to `out_dir` and renamed into place at the end, so a crash never leaves
a half-written model behind.

Details:
- The embedding/lm_head rows are `len(tokenizer)` rounded up to a multiple of 64. The extra
  (padding) rows of the input embedding and lm_head are zeroed: a zero lm_head row gives a
  logit of exactly 0 while real tokens' logits spread around 0, so with random weights greedy
  decoding essentially never picks an id the tokenizer cannot decode.
- `eos_token_id` is the id of `<|im_end|>` (end of a chat message), `pad_token_id` the
  tokenizer's pad id; both go into config.json and generation_config.json.
- Init is deterministic: the HF default init (normal, std = initializer_range = 0.02) under
  `torch.manual_seed(seed)`, inside a forked RNG so the caller's RNG state is untouched.
  Same seed -> bit-identical weights. We keep std 0.02. Logits of a random tiny model are
  nearly flat (std ~0.3 for tiny-qwen2, ~0.45 for tiny-k2), but greedy decoding is not
  ambiguous in practice: measured over 2048 greedy steps, the median top-1/top-2 logit gap
  is 0.05 (tiny-qwen2) / 0.08 (tiny-k2) and only 0.2% / 0.05% of steps have a gap under
  1e-4, while fp32 differences between two engines are ~1e-5. A greedy-equality test over
  many long sequences can still hit a rare near-tie; compare a few dozen short ones.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedModel

from k2post.chat.template import check_chat_format
from k2post.chat.tokens import IM_END
from k2post.models.flavors import FLAVORS, flavor_config, unknown_flavor_message

logger = logging.getLogger(__name__)

VOCAB_MULTIPLE = 64


def padded_vocab_size(num_tokens: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """`num_tokens` rounded up to a multiple of `multiple`."""
    return int(math.ceil(num_tokens / multiple) * multiple)


def count_params(model: torch.nn.Module) -> int:
    """Number of parameters (buffers such as the router bias excluded)."""
    return sum(param.numel() for param in model.parameters())


def _token_ids(tokenizer) -> dict[str, int | None]:
    """pad / eos (= `<|im_end|>`) / bos ids the model config and generation config use."""
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    if eos_id is None or eos_id == tokenizer.unk_token_id:
        raise ValueError(f"tokenizer has no {IM_END} token: it cannot end chat messages")
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": eos_id,
        "bos_token_id": tokenizer.bos_token_id,
    }


def build_flavor_config(flavor: str, tokenizer) -> PretrainedConfig:
    """The flavor's HF config sized for `tokenizer`, with its special token ids."""
    config = flavor_config(flavor, padded_vocab_size(len(tokenizer)))
    for key, value in _token_ids(tokenizer).items():
        setattr(config, key, value)
    return config


@torch.no_grad()
def _zero_padding_rows(model: PreTrainedModel, num_real_tokens: int) -> None:
    """Zero the embedding and lm_head rows of ids the tokenizer does not have."""
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        if module is not None:
            module.weight[num_real_tokens:].zero_()


def build_model(config: PretrainedConfig, seed: int, num_real_tokens: int) -> PreTrainedModel:
    """Randomly initialised causal LM from `config`, deterministic in `seed` (float32)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _zero_padding_rows(model, num_real_tokens)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model.eval()


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse to clobber an existing non-empty dir unless `overwrite`."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"model dir {str(out_dir)!r} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(
            f"model dir {str(out_dir)!r} already exists and is not empty; "
            "pass overwrite=True to rebuild it, or point at another dir"
        )


def _move_into_place(tmp_dir: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished `tmp_dir` to `out_dir` (replacing it when `overwrite`)."""
    old_dir: Path | None = None
    if out_dir.is_dir() and (overwrite or not any(out_dir.iterdir())):
        old_dir = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{tmp_dir.name}")
        os.replace(out_dir, old_dir)
    try:
        os.replace(tmp_dir, out_dir)
    except OSError as err:  # another process created out_dir in between
        if old_dir is not None and not out_dir.exists():
            os.replace(old_dir, out_dir)
        raise FileExistsError(f"model dir {str(out_dir)!r} appeared while it was being built") from err
    if old_dir is not None:
        shutil.rmtree(old_dir, ignore_errors=True)


def _save_all(model: PreTrainedModel, tokenizer, target: Path) -> None:
    """Write weights (safetensors), configs and tokenizer into `target`."""
    from k2post.models.tokenizer import save_tokenizer

    model.save_pretrained(target, safe_serialization=True)
    model.generation_config.save_pretrained(target)
    save_tokenizer(tokenizer, target)


def init_model_dir(
    flavor: str,
    out_dir: str | Path,
    seed: int = 0,
    vocab_size: int = 4096,
    overwrite: bool = False,
    chat_format: str = "instruct",
) -> Path:
    """Build flavor `flavor` with a fresh tokenizer (chat template of `chat_format`: "instruct" or "thinking") and
    save it atomically to `out_dir`."""
    from k2post.models.tokenizer import build_tokenizer

    out_path = Path(out_dir).absolute()
    _check_out_dir(out_path, overwrite)
    if flavor not in FLAVORS:  # before the tokenizer is trained
        raise KeyError(unknown_flavor_message(flavor))
    check_chat_format(chat_format)
    tokenizer = build_tokenizer(vocab_size=vocab_size, seed=seed, chat_format=chat_format)
    model = build_model(build_flavor_config(flavor, tokenizer), seed, len(tokenizer))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_path.name}.tmp-", dir=out_path.parent))
    try:
        _save_all(model, tokenizer, tmp_dir)
        _move_into_place(tmp_dir, out_path, overwrite)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info(
        "built model flavor=%s params=%s vocab=%d path=%s",
        flavor,
        f"{count_params(model):,}",
        model.config.vocab_size,
        out_path,
    )
    return out_path
