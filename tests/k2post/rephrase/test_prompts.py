"""The rephraser's prompts and chunk judges (k2post/rephrase/prompts.py, fidelity.py, rewriters.py): context cut,
thinking stripped, judge replies parsed without eval, judge failures as verdicts, the trained-judge adapter.
Run: python -m pytest tests/k2post/rephrase/test_prompts.py -q
"""

from __future__ import annotations

import pytest

from k2post.llm.client import LLMClientError
from k2post.rephrase.corpus import build_corpus, parse_fact, render_document, render_rewrite
from k2post.rephrase.fidelity import (
    ChecksJudge,
    ChunkJudge,
    LLMChunkJudge,
    ModelChunkJudge,
    added_numbers,
    parse_faithfulness,
)
from k2post.rephrase.prompts import CONTEXT_START, context_text, judge_messages, rewrite_messages, strip_thinking
from k2post.rephrase.rewriters import BuiltinRewriter, LLMRewriter, Rewriter, UnrewritableText

SOURCE = "Kalo was born in 1931. Kalo lives in Minal."
FAITHFUL = "Minal is the home of Kalo. The year 1931 saw the birth of Kalo."


class Replies:
    """A scripted LLMClient: returns the next reply (or raises it when it is an exception); records the calls."""

    def __init__(self, *replies):
        self.replies, self.calls = list(replies), []

    def chat(self, messages, **kw):
        self.calls.append((messages, kw))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def test_context_keeps_the_latest_characters_cut_at_a_word():
    assert context_text([], 100) == "" and context_text(["abc"], 0) == ""
    assert context_text(["One two.", "Three four."], 100) == "One two. Three four."
    assert context_text(["One two.", "Three four."], 13) == "...Three four."  # the tail ". Three four." cut at a word


def test_rewrite_prompt_has_style_context_and_passage():
    first = rewrite_messages("Kalo was born in 1931.", [], "As a news report.", 2000)
    assert [m.role for m in first] == ["system", "user"]
    assert "As a news report." in first[1].content and CONTEXT_START in first[1].content
    assert "Write only the rewritten passage." in first[1].content
    later = rewrite_messages("Kalo lives in Minal.", ["In 1931 Kalo was born."], "As a news report.", 2000)
    assert "In 1931 Kalo was born." in later[1].content and CONTEXT_START not in later[1].content
    assert SOURCE in judge_messages(SOURCE, FAITHFUL)[1].content


@pytest.mark.parametrize(
    ("reply", "text"),
    [
        ("  Plain text. ", "Plain text."),
        ("<think>hmm</think>\nThe rewrite.", "The rewrite."),
        ("</think>The rewrite.", "The rewrite."),
        ("<think>never closed", ""),
        ('"""\nQuoted.\n"""', "Quoted."),
    ],
)
def test_strip_thinking(reply, text):
    assert strip_thinking(reply) == text


@pytest.mark.parametrize(
    ("reply", "faithful", "reason"),
    [
        ("FAITHFUL", True, "judge: faithful: no reason given"),
        ("FAITHFUL. Every fact is kept.", True, "Every fact is kept."),
        ("Unfaithful: the year changed", False, "judge: unfaithful: the year changed"),
        ("<think>the year? fine</think>faithful", True, "judge: faithful"),
        ("<think>looks FAITHFUL</think>UNFAITHFUL - a city was added", False, "a city was added"),
        ("The rewrite is not faithful: it drops a name.", False, "it drops a name"),
        ("maybe", False, "unparseable judge reply: 'maybe'"),
        ("", False, "unparseable judge reply"),
        ("__import__('os').system('echo FAITH')", False, "unparseable"),
    ],
)
def test_llm_judge_reply_parsing(reply, faithful, reason):
    verdict = parse_faithfulness(reply)
    assert verdict.faithful is faithful and verdict.score == float(faithful) and reason in verdict.reason


def test_checks_judge_names_what_was_lost_or_added():
    assert ChecksJudge().judge(SOURCE, FAITHFUL).faithful
    lost = ChecksJudge().judge(SOURCE, "Kalo lives in Minal.")
    assert not lost.faithful and lost.reason == "lost 1931" and 0 < lost.score < 1
    added = ChecksJudge().judge(SOURCE, FAITHFUL + " Kalo has 3 cats.")
    assert not added.faithful and added.reason == "added 3" and added.score == 0.0
    assert added_numbers("It has 3,000 rooms.", "It has 3000 rooms and 2 halls.") == ["2"]
    assert ChecksJudge().judge(SOURCE, "  ").reason == "empty rewrite"


def test_llm_judge_asks_only_after_the_checks_and_never_raises():
    client = Replies("FAITHFUL: same facts.", LLMClientError("POST /chat/completions: status 503"), 42)
    judge = LLMChunkJudge(client, max_tokens=32)
    assert isinstance(judge, ChunkJudge)
    assert judge.judge(SOURCE, "Kalo lives in Minal.").reason == "lost 1931" and not client.calls
    assert judge.judge(SOURCE, FAITHFUL).faithful
    assert client.calls[0][1] == {"temperature": 0.0, "max_tokens": 32}
    failed = judge.judge(SOURCE, FAITHFUL)
    assert not failed.faithful and failed.reason.startswith("judge call failed: LLMClientError: POST")
    assert not judge.judge(SOURCE, FAITHFUL).faithful  # a non-text reply is unparseable, not a crash


class FakeTrainedJudge:
    """Stands in for k2post.judging.faithfulness_model's trained judge: a probability per (source, sentence)."""

    threshold = 0.5

    def __init__(self, unsupported: str = ""):
        self.unsupported, self.pairs = unsupported, []

    def supported_probs(self, pairs):
        self.pairs += pairs
        return [0.1 if self.unsupported and self.unsupported in sentence else 0.9 for _, sentence in pairs]


def test_model_judge_scores_every_sentence_against_the_source():
    trained = FakeTrainedJudge()
    verdict = ModelChunkJudge(trained).judge(SOURCE, FAITHFUL)
    assert verdict.faithful and verdict.score == 0.9
    assert trained.pairs == [(SOURCE, "Minal is the home of Kalo."), (SOURCE, "The year 1931 saw the birth of Kalo.")]
    verdict = ModelChunkJudge(FakeTrainedJudge(unsupported="Minal")).judge(SOURCE, FAITHFUL)
    assert not verdict.faithful and verdict.score == 0.1 and "'Minal is the home of Kalo.'" in verdict.reason
    trained = FakeTrainedJudge()
    assert ModelChunkJudge(trained).judge(SOURCE, "Kalo lives in Minal.").reason == "lost 1931" and not trained.pairs


def test_llm_rewriter_sends_the_prompt_and_strips_the_reply():
    client = Replies("<think>ok</think>  The rewrite.  ", "")
    rewriter = LLMRewriter(client, temperature=0.3, max_tokens=64, context_chars=100)
    assert isinstance(rewriter, Rewriter)
    assert rewriter.rewrite("Kalo lives in Minal.", ["Before."], "As a poem.", 1, "doc") == "The rewrite."
    messages, kw = client.calls[0]
    assert kw == {"temperature": 0.3, "max_tokens": 64} and "Before." in messages[1].content
    with pytest.raises(ValueError, match="empty rewrite"):
        rewriter.rewrite("Kalo lives in Minal.", [], "As a poem.", 1, "doc")


def test_builtin_rewriter_rerenders_corpus_sentences_only():
    entity = build_corpus(6, seed=0)[0]
    source = render_document(entity, 0)
    for k in (1, 2, 3):
        rewrite = BuiltinRewriter().rewrite(source, [], "ignored", k, entity.name)
        assert rewrite == render_rewrite(entity, k)
    with pytest.raises(UnrewritableText, match="builtin backend rewrites only the synthetic corpus's sentences"):
        BuiltinRewriter().rewrite(source + " It rained a lot.", [], "", 1, entity.name)
    assert parse_fact("It rained a lot.") is None
