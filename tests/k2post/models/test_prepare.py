"""`k2post model prepare`: a model and tokenizer k2post did not build (GPT-2 and Llama architectures, a BPE
tokenizer trained here without any K2 token) get K2's special tokens, chat template and resized embeddings."""

from __future__ import annotations

import pytest
import torch

from k2post.chat.template import CHAT_TEMPLATE_JINJA, render_ids, special_token_ids
from k2post.chat.tokens import PAD, SPECIAL_TOKENS
from k2post.chat.types import Message
from k2post.chat.template import missing_special_tokens
from k2post.models.prepare import PrepareError, prepare_model_dir

ADDED = [token for token in SPECIAL_TOKENS if token != "<|endoftext|>"]  # the foreign tokenizer has that one
TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, how are you today?", "numbers 12 345 6789"] * 20


def _foreign_model(path, arch: str):
    """A random tiny model + a BPE tokenizer with only `<|endoftext|>`, saved with plain transformers."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"]))
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
    assert missing_special_tokens(before) == ADDED
    with pytest.raises(ValueError, match="has no id for special token"):
        special_token_ids(before)  # what SFT said before: the reason for `prepare`
    report = prepare_model_dir(source, tmp_path / "prepared")
    assert list(report.added_tokens) == ADDED and report.pad_token_set and report.template_replaced
    assert report.vocab_after == report.vocab_before + len(ADDED)
    assert f"special tokens added: {len(ADDED)}" in report.summary() and "mean of the old rows" in report.summary()

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "prepared")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "prepared")
    ids = special_token_ids(tokenizer)  # every K2 token is one id now
    assert sorted(ids[t] for t in ADDED) == list(range(report.vocab_before, report.vocab_after))
    assert ids["<|endoftext|>"] == before.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.pad_token == PAD and tokenizer.chat_template == CHAT_TEMPLATE_JINJA
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
        ([str(source), "--out", str(source)], "must differ from the source dir"),
    ]
    for argv, needle in cases:
        assert main(["prepare", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1 and err.startswith("k2post model: error: "), err
    assert main(["prepare", str(source), "--out", str(tmp_path / "taken"), "--overwrite"]) == 0
    assert f"special tokens added: {len(ADDED)}" in capsys.readouterr().out and not (tmp_path / "taken" / "x").exists()
    with pytest.raises(PrepareError, match="exists and is not empty"):
        prepare_model_dir(source, tmp_path / "taken")
