"""Bring your own model: give any HF causal-LM directory K2's special tokens and chat template.

    k2post model prepare path/to/hf_model --out artifacts/models/mine     # the CLI (pipelines/model.py)
    report = prepare_model_dir("path/to/hf_model", "artifacts/models/mine")
    print(report.summary())

What it does, and says it did:
- adds every K2 chat token the tokenizer lacks (`<|im_user|>`, `<|im_assistant|>`, `<|im_system|>`,
  `<|im_middle|>`, `<|im_end|>`, the five tool-call tokens, `<think>`, `</think>`; k2post.chat.tokens.CHAT_TOKENS)
  as a special token, so each renders as one id (a tokenizer that has them all, as K2's own does, gets none);
- adds `<|pad|>` and makes it the pad token when the tokenizer has no pad token;
- sets the chat template to K2's of `chat_format` (instruct: K2-Instruct's; thinking: K2-Thinking's; the same Jinja
  templates `k2post model init` writes, equal to k2post.chat.template's renderer);
- resizes the input (and, when untied, output) embeddings to the new vocabulary; each new row is the mean of
  the old rows (a neutral start: the new tokens begin where an average token is, not at random norms);
- writes model + tokenizer to a temporary dir beside `--out` and renames it into place when complete (an existing
  non-empty `--out` is replaced only with `overwrite`, and only then; `--out` equal to, inside or containing the
  source is refused, k2post.models.outdir).

A source it cannot use is one line (PrepareError) before anything loads: no config.json, absurd config values
(k2post.models.config_check), no tokenizer vocabulary file (prepare never makes a tokenizer up), missing, damaged or
dangling-symlink weights (k2post.models.weights), or weights that do not fit in the memory available.

Nothing else changes: the old tokens keep their ids and rows, the eos token stays the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k2post.chat.template import CHAT_TEMPLATES, check_chat_format, missing_special_tokens
from k2post.chat.tokens import PAD
from k2post.models.outdir import staged_dir

VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


class PrepareError(ValueError):
    """The input is not a usable HF causal-LM dir, or the output dir is taken."""


@dataclass
class PrepareReport:
    """What `prepare_model_dir` changed."""

    source: str
    out: str
    added_tokens: dict[str, int] = field(default_factory=dict)
    vocab_before: int = 0
    vocab_after: int = 0
    pad_token_set: bool = False
    template_replaced: bool = False
    chat_format: str = "instruct"

    def summary(self) -> str:
        added = ", ".join(f"{token}={token_id}" for token, token_id in self.added_tokens.items()) or "none"
        template = f"{'replaced by' if self.template_replaced else 'already'} K2's {self.chat_format}"
        lines = [
            f"prepared {self.source} -> {self.out}",
            f"  special tokens added: {len(self.added_tokens)} ({added})",
            f"  embedding rows: {self.vocab_before} -> {self.vocab_after} (new rows: the mean of the old rows)",
            f"  pad token: {'set to ' + PAD if self.pad_token_set else 'kept'}",
            f"  chat template: {template}",
        ]
        return "\n".join(lines)


def check_dirs(source: Path, out: Path, overwrite: bool) -> None:
    """PrepareError (one line) for a source that is not a usable HF model dir (no or absurd config.json, no
    tokenizer vocabulary, missing / damaged / dangling weights) or an `out` that may not be written (the source,
    inside it, containing it, a file, taken; k2post.models.outdir). Reads only small files and headers."""
    from k2post.models.outdir import check_out_dir
    from k2post.models.weights import check_model_source

    if not (source / "config.json").is_file():
        raise PrepareError(f"{source}: not an HF model directory (no config.json)")
    try:
        check_model_source(source, "HF_DIR")
        if not any((source / name).is_file() for name in VOCAB_FILES):
            raise PrepareError(
                f"{source}: no tokenizer vocabulary ({', '.join(VOCAB_FILES)}): copy the model's tokenizer files "
                "into it (prepare adds K2's tokens to the model's own tokenizer, it does not make one)"
            )
        check_out_dir(source, out, overwrite, "--out")
    except (OSError, ValueError) as err:
        raise PrepareError(str(err)) from None


def load_source(source: Path) -> tuple[Any, Any]:
    """(tokenizer, model) of `source`; PrepareError (one line) when transformers cannot load either or the
    tokenizer is far smaller than the model's vocabulary (not this model's tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from k2post.models.load_errors import load_user_model
    from k2post.models.weights import check_fits_in_memory

    check_fits_in_memory(source, "HF_DIR")
    try:
        tokenizer, model = load_user_model(
            source,
            "HF_DIR",
            lambda: (AutoTokenizer.from_pretrained(source), AutoModelForCausalLM.from_pretrained(source, dtype="auto")),
        )
    except ValueError as err:
        raise PrepareError(str(err)) from None
    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) < rows // 2:
        raise PrepareError(
            f"{source}: its tokenizer has {len(tokenizer)} tokens for {rows} embedding rows: not this model's "
            "tokenizer (copy the model's own tokenizer files into the dir)"
        )
    return tokenizer, model


def mean_init_new_rows(model, old_rows: int) -> None:
    """New embedding rows (input, and output when untied) := the mean of the first `old_rows` rows."""
    import torch

    with torch.no_grad():
        for embedding in {
            id(m): m for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m
        }.values():
            weight = embedding.weight
            if weight.shape[0] > old_rows:
                weight[old_rows:] = weight[:old_rows].mean(dim=0, keepdim=True)


def tokens_to_add(tokenizer) -> list[str]:
    """What `prepare` adds: `<|pad|>` when the tokenizer has no pad token (nor that token), then every missing K2
    chat token."""
    has_pad = tokenizer.pad_token is not None or not missing_special_tokens(tokenizer, (PAD,))
    return ([] if has_pad else [PAD]) + missing_special_tokens(tokenizer)


def prepare_model_dir(
    source: str | Path, out: str | Path, overwrite: bool = False, chat_format: str = "instruct"
) -> PrepareReport:
    """Write `source` with K2's special tokens, `chat_format`'s chat template and resized embeddings to `out`."""
    source, out = Path(source), Path(out)
    check_chat_format(chat_format)
    check_dirs(source, out, overwrite)
    tokenizer, model = load_source(source)
    report = PrepareReport(str(source), str(out), vocab_before=model.get_input_embeddings().weight.shape[0])
    report.chat_format = chat_format
    missing = tokens_to_add(tokenizer)
    if missing:
        from tokenizers import AddedToken

        added = [AddedToken(token, special=True, normalized=False, lstrip=False, rstrip=False) for token in missing]
        tokenizer.add_tokens(added, special_tokens=True)
        report.added_tokens = {token: tokenizer.convert_tokens_to_ids(token) for token in missing}
    if tokenizer.pad_token is None:
        tokenizer.pad_token, report.pad_token_set = PAD, True
    report.template_replaced = tokenizer.chat_template != CHAT_TEMPLATES[chat_format]
    tokenizer.chat_template = CHAT_TEMPLATES[chat_format]
    if len(tokenizer) > report.vocab_before:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        mean_init_new_rows(model, report.vocab_before)
    report.vocab_after = model.get_input_embeddings().weight.shape[0]
    if tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
    with staged_dir(out) as tmp:  # the old --out is replaced only once the new one is complete
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return report
