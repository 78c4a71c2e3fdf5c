"""Sentence-end chunking and the deterministic fidelity checks (k2post/rephrase/chunking.py, fidelity.py).
Run: python -m pytest tests/k2post/rephrase/test_chunking_fidelity.py -q
"""

from __future__ import annotations

import pytest

from k2post.rephrase.chunking import chunk_document, split_sentences
from k2post.rephrase.corpus import N_STYLES, build_corpus, render_document
from k2post.rephrase.fidelity import missing_facts, names, numbers

WORDS = lambda s: len(s.split())  # noqa: E731


@pytest.mark.parametrize(
    ("text", "sentences"),
    [
        ("One. Two! Three?", ["One.", "Two!", "Three?"]),
        ('He said "go." Then 1999 came.', ['He said "go."', "Then 1999 came."]),
        ("Pi is 3.14 here. Then e.g. this.", ["Pi is 3.14 here.", "Then e.g. this."]),
        ("  ", []),
    ],
)
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_chunks_end_at_sentences_and_respect_the_budget():
    text = "A b c. D e. F g h i. J."
    assert chunk_document(text, WORDS, 5) == ["A b c. D e.", "F g h i. J."]
    assert chunk_document(text, WORDS, 3) == ["A b c.", "D e.", "F g h i.", "J."]  # a long sentence stays whole
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        chunk_document(text, WORDS, 0)


@pytest.mark.parametrize(
    ("source", "rewrite", "missing"),
    [
        ("Kalo was born in 1950.", "The year 1950 saw the birth of Kalo.", []),
        ("Kalo was born in 1950.", "The year 1951 saw the birth of Kalo.", ["1950"]),
        ("Kalo lives in Mizo.", "Kalo lives in Renka.", ["Mizo"]),
        ("It has 3,000,000 people.", "3000000 people live there.", []),
        ("In March 2001 Sato left.", "Sato left in 2001.", ["March"]),
    ],
)
def test_missing_facts(source, rewrite, missing):
    assert missing_facts(source, rewrite) == missing


def test_every_corpus_style_keeps_the_facts_of_the_original():
    for entity in build_corpus(15, seed=0):
        original = render_document(entity, 0)
        assert numbers(original) and names(original)
        for style in range(1, N_STYLES):
            assert missing_facts(original, render_document(entity, style)) == [], (entity.name, style)
