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
- writes model + tokenizer to `--out` (never over an existing non-empty dir unless `overwrite`).

Nothing else changes: the old tokens keep their ids and rows, the eos token stays the model's own.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from k2post.chat.template import CHAT_TEMPLATES, check_chat_format, missing_special_tokens
from k2post.chat.tokens import PAD


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
    """PrepareError (one line) for a source that is not an HF model dir or a taken `out` (checks only)."""
    if not (source / "config.json").is_file():
        raise PrepareError(f"{source}: not an HF model directory (no config.json)")
    if out.resolve() == source.resolve():
        raise PrepareError(f"--out {out}: must differ from the source dir (the source is left as it is)")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise PrepareError(f"--out {out}: exists and is not empty (pass --overwrite to replace it)")


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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, out = Path(source), Path(out)
    check_chat_format(chat_format)
    check_dirs(source, out, overwrite)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, torch_dtype="auto")
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
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return report
