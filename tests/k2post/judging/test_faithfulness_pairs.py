"""Synthetic judge pairs (k2post/judging/faithfulness_pairs.py): labels mean what their kind says.
Run: python -m pytest tests/k2post/judging/test_faithfulness_pairs.py -q
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from k2post.judging.faithfulness_pairs import KINDS, PERTURBATIONS, make_pairs
from k2post.rephrase.chunking import split_sentences
from k2post.rephrase.corpus import build_corpus, parse_fact

CORPUS = build_corpus(40, seed=5)
PAIRS = make_pairs(CORPUS, 1000, seed=3)


def _facts(text: str) -> set:
    return {parse_fact(sentence) for sentence in split_sentences(text)} - {None}


def test_half_supported_and_every_kind_present_deterministically():
    counts = Counter(p.kind for p in PAIRS)
    assert counts["faithful"] == 500 and set(counts) == set(KINDS)
    assert all(counts[kind] == 100 for kind in PERTURBATIONS)
    assert all(p.supported == (p.kind == "faithful") for p in PAIRS)
    assert make_pairs(CORPUS, 50, seed=3) == make_pairs(CORPUS, 50, seed=3) != make_pairs(CORPUS, 50, seed=4)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_relates_to_its_source_as_described(kind):
    for pair in [p for p in PAIRS if p.kind == kind][:40]:
        stated, source_facts = parse_fact(pair.sentence), _facts(pair.source)
        if kind == "faithful":
            assert stated in source_facts
        elif kind == "swapped_entity":
            assert stated not in source_facts and stated is not None
        elif kind == "changed_number":
            assert stated not in source_facts and re.search(r"\d", pair.sentence)
            same = [f for f in source_facts if (f.subject, f.relation) == (stated.subject, stated.relation)]
            assert same and same[0].value != stated.value
        elif kind == "negation":
            assert re.search(r"\bnot\b", pair.sentence)
        elif kind == "unsupported_addition":  # true of the entity, left out of the source
            assert stated not in source_facts
            assert stated in {f for e in CORPUS for f in e.facts}
        else:
            assert " and " in pair.sentence and stated is None


def test_bad_arguments_are_one_line():
    with pytest.raises(ValueError, match="needs >= 2 entities"):
        make_pairs(CORPUS[:1], 10, seed=0)
