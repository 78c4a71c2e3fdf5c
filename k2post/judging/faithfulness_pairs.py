"""(source, sentence, supported) pairs for training and testing a sentence-level faithfulness judge, synthesized from
the knowledge corpus (k2post.rephrase.corpus).

A source is one entity's document (sometimes two entities' documents) in a random wording; the sentence is either
supported by it (a fact of the source in any template: a faithful paraphrase) or broken in one of five ways:

| kind                 | the sentence                                                               |
|----------------------|----------------------------------------------------------------------------|
| faithful             | a fact of the source, in any template (often not the source's wording)     |
| swapped_entity       | a fact whose value (city, company, river, year...) or subject is swapped   |
| changed_number       | a numeric fact (year, headcount) with the number changed                   |
| negation             | a fact of the source, negated                                              |
| unsupported_addition | a true fact of the entity that the source leaves out                       |
| extra_claim          | a fact of the source with a claim appended that the source does not make   |

Half the pairs are faithful, the other half spread evenly over the five perturbations.

    pairs = make_pairs(build_corpus(300, seed=0), n_pairs=4000, seed=0)
    pairs[0]      # JudgePair(source="Kalo was born in 1931. ...", sentence="...", supported=False, kind="negation")
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from k2post.rephrase.corpus import DOC_TEMPLATES, N_STYLES, Entity, Fact, render_facts

PERTURBATIONS = ("swapped_entity", "changed_number", "negation", "unsupported_addition", "extra_claim")
KINDS = ("faithful", *PERTURBATIONS)
NUMERIC = frozenset({"born_year", "founded_year", "employees", "population"})
NEGATED = {
    "born_year": "{s} was not born in {v}.",
    "home_city": "{s} does not live in {v}.",
    "employer": "{s} does not work for {v}.",
    "founded_year": "{s} was not founded in {v}.",
    "headquarters": "{s} is not headquartered in {v}.",
    "employees": "{s} does not have {v} employees.",
    "population": "{s} does not have a population of {v}.",
    "river": "{s} does not lie on the {v} river.",
}
ADDITIONS = (
    "won a national award in {y}",
    "was praised in the press in {y}",
    "opened a second office abroad",
    "is famous for its old stone bridges",
    "was renamed in {y}",
    "has a large public library",
)


@dataclass(frozen=True)
class JudgePair:
    """One judge example: is `sentence` supported by `source`? `kind` says how it was made."""

    source: str
    sentence: str
    supported: bool
    kind: str


def sentence_of(fact: Fact, rng: random.Random) -> str:
    """`fact` in a template of a random style."""
    return DOC_TEMPLATES[fact.relation][rng.randrange(N_STYLES)].format(s=fact.subject, v=fact.value)


def _source(entity: Entity, others: list[Entity], rng: random.Random, facts: list[Fact]) -> str:
    """`facts` of the entity in a random wording, with another entity's document before or after half the time."""
    parts = [render_facts(facts, rng.randrange(0, 50), entity.name)]
    if rng.random() < 0.5:
        other = rng.choice(others)
        parts.insert(rng.randrange(2), render_facts(other.facts, rng.randrange(0, 50), other.name))
    return " ".join(parts)


def _changed_number(value: str, relation: str, rng: random.Random) -> str:
    number = int(value)
    delta = rng.randint(1, 12) if relation.endswith("year") else max(1, int(number * rng.uniform(0.1, 0.6)))
    return str(number + delta if rng.random() < 0.5 or number - delta <= 0 else number - delta)


def _swapped(fact: Fact, entity: Entity, pool: dict[str, list[str]], names: list[str], rng: random.Random) -> Fact:
    """The fact with its value replaced by another entity's value of the same relation, or its subject renamed."""
    values = [v for v in pool[fact.relation] if v != fact.value]
    if values and rng.random() < 0.7:
        return Fact(fact.subject, fact.relation, rng.choice(values))
    return Fact(rng.choice([name for name in names if name != entity.name]), fact.relation, fact.value)


def _negated(fact: Fact, rng: random.Random) -> str:
    if rng.random() < 0.6:
        return NEGATED[fact.relation].format(s=fact.subject, v=fact.value)
    sentence = sentence_of(fact, rng)
    if not sentence.startswith((fact.subject, fact.value)):
        sentence = sentence[0].lower() + sentence[1:]
    return "It is not true that " + sentence


def _pair(kind: str, entity: Entity, corpus: list[Entity], pool: dict[str, list[str]], rng: random.Random) -> JudgePair:
    facts, others = list(entity.facts), [e for e in corpus if e is not entity]
    fact = rng.choice([f for f in facts if f.relation in NUMERIC] if kind == "changed_number" else facts)
    source_facts = [f for f in facts if f is not fact] if kind == "unsupported_addition" else facts
    source = _source(entity, others, rng, source_facts)
    if kind in ("faithful", "unsupported_addition"):
        sentence = sentence_of(fact, rng)
    elif kind == "swapped_entity":
        sentence = sentence_of(_swapped(fact, entity, pool, [e.name for e in corpus], rng), rng)
    elif kind == "changed_number":
        sentence = sentence_of(Fact(fact.subject, fact.relation, _changed_number(fact.value, fact.relation, rng)), rng)
    elif kind == "negation":
        sentence = _negated(fact, rng)
    else:  # extra_claim
        addition = rng.choice(ADDITIONS).format(y=rng.randint(1900, 2020))
        sentence = sentence_of(fact, rng).rstrip(".") + " and " + addition + "."
    return JudgePair(source, sentence, kind == "faithful", kind)


def make_pairs(corpus: list[Entity], n_pairs: int, seed: int) -> list[JudgePair]:
    """`n_pairs` pairs about the corpus's entities: half faithful, the rest spread over PERTURBATIONS (seeded)."""
    if len(corpus) < 2 or n_pairs < 1:
        raise ValueError(f"make_pairs needs >= 2 entities and n_pairs >= 1, got {len(corpus)} and {n_pairs}")
    rng = random.Random(f"judge-pairs/{seed}")
    pool: dict[str, list[str]] = {}
    for entity in corpus:
        for fact in entity.facts:
            pool.setdefault(fact.relation, []).append(fact.value)
    kinds = ["faithful" if i % 2 == 0 else PERTURBATIONS[(i // 2) % len(PERTURBATIONS)] for i in range(n_pairs)]
    rng.shuffle(kinds)
    return [_pair(kind, rng.choice(corpus), corpus, pool, rng) for kind in kinds]
