"""`k2post model prepare`: a model and tokenizer k2post did not build (GPT-2 and Llama architectures, a BPE
tokenizer trained here without any K2 token) get K2's special tokens, chat template and resized embeddings."""

from __future__ import annotations

import pytest
import torch

from k2post.chat.template import CHAT_TEMPLATES, chat_format, missing_special_tokens, render_ids, special_token_ids
from k2post.chat.tokens import CHAT_TOKENS, PAD
from k2post.chat.types import Message
from k2post.models.prepare import PrepareError, prepare_model_dir

ADDED = [PAD, *CHAT_TOKENS]  # the foreign tokenizer has no pad token and none of K2's 12 chat tokens: 13 added
TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, how are you today?", "numbers 12 345 6789"] * 20


def _foreign_model(path, arch: str, k2_tokens: bool = False):
    """A random tiny model + a BPE tokenizer saved with plain transformers: with only `<|endoftext|>`, or (`k2_tokens`)
    shaped like K2's own (`[EOS]`, `[PAD]` and all K2 chat tokens, a template of its own)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["[EOS]", "[PAD]", *CHAT_TOKENS] if k2_tokens else ["<|endoftext|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=special))
    if k2_tokens:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=bpe,
            eos_token="[EOS]",
            pad_token="[PAD]",
            extra_special_tokens=list(CHAT_TOKENS),
            chat_template="{% for m in messages %}{{ m.content }}{% endfor %}",
        )
    else:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    vocab = len(tokenizer)
    torch.manual_seed(0)
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_layer=2, n_embd=32, n_head=2, n_positions=256))
    else:
        sizes = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
        model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, tie_word_embeddings=False, **sizes))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_prepare_adds_k2_tokens_template_and_mean_rows(tmp_path, arch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, before = _foreign_model(tmp_path / "foreign", arch)
    assert missing_special_tokens(before) == list(CHAT_TOKENS)
    with pytest.raises(ValueError, match="has no id for special token"):
        special_token_ids(before)  # what SFT said before: the reason for `prepare`
    report = prepare_model_dir(source, tmp_path / "prepared")
    assert list(report.added_tokens) == ADDED and report.pad_token_set and report.template_replaced
    assert report.vocab_after == report.vocab_before + len(ADDED)
    assert f"special tokens added: {len(ADDED)}" in report.summary() and "mean of the old rows" in report.summary()

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "prepared")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "prepared")
    special_token_ids(tokenizer)  # every K2 token is one id now
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ADDED}
    assert sorted(ids.values()) == list(range(report.vocab_before, report.vocab_after))
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") == before.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.pad_token == PAD and tokenizer.chat_template == CHAT_TEMPLATES["instruct"]
    assert chat_format(tokenizer) == "instruct"
    assert tokenizer("hello world").input_ids == before("hello world").input_ids  # old ids unchanged
    old = AutoModelForCausalLM.from_pretrained(source)
    for new_w, old_w in (
        (model.get_input_embeddings().weight, old.get_input_embeddings().weight),
        (model.get_output_embeddings().weight, old.get_output_embeddings().weight),
    ):
        assert torch.equal(new_w[: report.vocab_before], old_w)
        assert torch.allclose(
            new_w[report.vocab_before :], old_w.mean(0, keepdim=True).expand(len(ADDED), -1), atol=1e-6
        )

    dialogue = [Message(role="user", content="hello world"), Message(role="assistant", content="how are you")]
    rendered = render_ids(tokenizer, dialogue)  # the SFT renderer accepts it ...
    hf = tokenizer.apply_chat_template([m.to_openai() for m in dialogue], tokenize=False)
    assert hf == rendered.text  # ... and the HF template renders the same text
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([rendered.input_ids])).logits
    assert logits.shape[-1] == report.vocab_after and torch.isfinite(logits).all()


def test_prepare_errors_are_one_line(tmp_path, capsys):
    from k2post_pipelines.model import main

    source, _ = _foreign_model(tmp_path / "foreign", "gpt2")
    capsys.readouterr()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    cases = [
        ([str(tmp_path), "--out", str(tmp_path / "o")], "not an HF model directory (no config.json)"),
        ([str(source), "--out", str(tmp_path / "taken")], "exists and is not empty (pass --overwrite"),
        ([str(source), "--out", str(source)], "is the source dir"),
    ]
    for argv, needle in cases:
        assert main(["prepare", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1 and err.startswith("k2post model: error: "), err
    assert (
        main(["prepare", str(source), "--out", str(tmp_path / "taken"), "--overwrite", "--chat-format", "thinking"])
        == 0
    )
    out = capsys.readouterr().out
    assert f"special tokens added: {len(ADDED)}" in out and "chat template: replaced by K2's thinking" in out
    assert not (tmp_path / "taken" / "x").exists()
    with pytest.raises(PrepareError, match="exists and is not empty"):
        prepare_model_dir(source, tmp_path / "taken")


@pytest.mark.parametrize("fmt", ["instruct", "thinking"])
def test_prepare_adds_nothing_to_a_tokenizer_with_k2s_tokens(tmp_path, fmt):
    """A K2-shaped tokenizer (its own eos and pad, every K2 chat token) gets no new token and no new row: only the
    chat template of the asked format (before, `<|im_begin|>`, `<|pad|>` and `<|endoftext|>` rows were added)."""
    from transformers import AutoTokenizer

    source, before = _foreign_model(tmp_path / "k2like", "gpt2", k2_tokens=True)
    assert missing_special_tokens(before) == []
    report = prepare_model_dir(source, tmp_path / "prepared", chat_format=fmt)
    assert report.added_tokens == {} and report.vocab_after == report.vocab_before and not report.pad_token_set
    assert "special tokens added: 0 (none)" in report.summary() and f"replaced by K2's {fmt}" in report.summary()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "prepared")
    assert len(tokenizer) == len(before) and tokenizer.pad_token == "[PAD]" and chat_format(tokenizer) == fmt
    assert special_token_ids(tokenizer) == special_token_ids(before)
    dialogue = [Message(role="user", content="hello world")]
    rendered = render_ids(tokenizer, dialogue, add_generation_prompt=True)
    hf = tokenizer.apply_chat_template([m.to_openai() for m in dialogue], tokenize=False, add_generation_prompt=True)
    assert hf == rendered.text and rendered.text.endswith("<think>" if fmt == "thinking" else "<|im_middle|>")
