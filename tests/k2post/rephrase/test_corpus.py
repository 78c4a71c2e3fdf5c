"""The synthetic knowledge corpus (k2post/rephrase/corpus.py): same facts in every style, questions unlike the text.
Run: python -m pytest tests/k2post/rephrase/test_corpus.py -q
"""

from __future__ import annotations

import re

import pytest

from k2post.rephrase.corpus import DOC_TEMPLATES, N_STYLES, QUESTION_TEMPLATES, build_corpus, questions, render_document


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower().replace("{s}", " ").replace("{v}", " "))


def _four_grams(text: str) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + 4]) for i in range(len(words) - 3)}


def test_corpus_is_deterministic_with_unique_names():
    a, b = build_corpus(30, seed=1), build_corpus(30, seed=1)
    assert [(e.name, e.facts) for e in a] == [(e.name, e.facts) for e in b]
    assert len({e.name for e in a}) == 30 and build_corpus(30, seed=2)[0].facts != a[0].facts
    assert {e.kind for e in a} == {"person", "company", "city"}


@pytest.mark.parametrize("style", range(N_STYLES))
def test_every_style_states_every_fact_once(style):
    for entity in build_corpus(12, seed=0):
        text = render_document(entity, style)
        assert text.count(". ") + 1 == len(entity.facts)
        assert all(f.value in text and entity.name in text for f in entity.facts)


def test_styles_differ_in_wording():
    entity = build_corpus(3, seed=0)[0]
    texts = {render_document(entity, s) for s in range(N_STYLES)}
    assert len(texts) == N_STYLES


def test_questions_share_no_four_word_run_with_any_document_template():
    doc_grams = set().union(*(_four_grams(t) for templates in DOC_TEMPLATES.values() for t in templates))
    for question in QUESTION_TEMPLATES.values():
        assert not _four_grams(question) & doc_grams, question
    entity = build_corpus(3, seed=0)[2]
    assert [a for _, a in questions(entity)] == [f.value for f in entity.facts]


def test_bad_arguments_are_one_line():
    with pytest.raises(ValueError, match="n_entities must be >= 3"):
        build_corpus(2, seed=0)
    with pytest.raises(ValueError, match=r"style must be in \[0, 4\)"):
        render_document(build_corpus(3, seed=0)[0], 4)


def test_rewrites_keep_the_facts_in_new_words_and_orders():
    from k2post.rephrase.chunking import split_sentences
    from k2post.rephrase.corpus import parse_fact, render_rewrite

    entity = build_corpus(6, seed=3)[1]
    rewrites = [render_rewrite(entity, k) for k in range(11)]
    assert rewrites[0] == render_document(entity, 0) and len(set(rewrites)) >= 9
    for text in rewrites:
        parsed = [parse_fact(sentence) for sentence in split_sentences(text)]
        assert sorted(parsed, key=lambda f: f.relation) == sorted(entity.facts, key=lambda f: f.relation)
    assert parse_fact("The weather is nice.") is None
    with pytest.raises(ValueError, match="rewrite_index must be >= 0"):
        render_rewrite(entity, -1)
