"""A synthetic knowledge corpus: invented entities with attributes and relations, rendered as documents in several
styles, and closed-book questions phrased unlike any rendering.

Every fact is a (subject, relation, value) triple. A document about an entity states each of its facts once; the
style picks the sentence template of each relation and the order of the facts, so two styles of one entity carry
the same facts in different words (what a faithful rephrasing does). Questions use their own templates, which share
no four-word run with any document template (tested), so a model answers them from the facts, not by continuing a
memorized sentence.

    entities = build_corpus(n_entities=200, seed=0)
    text = render_document(entities[0], style=3)          # style 0 is the "original"; 1.. are rephrasings
    text = render_rewrite(entities[0], rewrite_index=7)   # rewrite k >= 1: a template per fact and an order of its own
    pairs = questions(entities[0])                        # [(question, answer), ...]
    parse_fact("Kalo was born in 1931.")                  # Fact("Kalo", "born_year", "1931"): rendering inverted
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

SYLLABLES = ["ka", "lo", "mi", "ren", "sa", "tor", "vel", "dun", "ir", "bex", "qua", "zo", "nal", "phi", "gar", "ust"]
KINDS = ("person", "company", "city")
RELATIONS = {
    "person": ("born_year", "home_city", "employer"),
    "company": ("founded_year", "headquarters", "employees"),
    "city": ("population", "river", "founded_year"),
}

# style -> relation -> sentence templates ({s}: subject, {v}: value); style 0 is the original document's wording
DOC_TEMPLATES: dict[str, list[str]] = {
    "born_year": ["{s} was born in {v}.", "The year {v} saw the birth of {s}.", "Born in {v}, {s} grew up quickly.",
                  "{s}'s birth year is {v}."],
    "home_city": ["{s} lives in {v}.", "{v} is the home of {s}.", "These days {s} resides in {v}.",
                  "You can find {s} living in {v}."],
    "employer": ["{s} works for {v}.", "{v} employs {s}.", "{s} earns a living at {v}.", "On weekdays {s} is at {v}."],
    "founded_year": ["{s} was founded in {v}.", "The founding of {s} dates to {v}.", "In {v}, {s} came into being.",
                     "{s} has existed since {v}."],
    "headquarters": ["{s} is headquartered in {v}.", "The main office of {s} sits in {v}.",
                     "{v} hosts the head office of {s}.", "{s} runs its business from {v}."],
    "employees": ["{s} has {v} employees.", "A staff of {v} people works at {s}.",
                  "{v} people are on the payroll of {s}.", "The workforce of {s} numbers {v}."],
    "population": ["{s} has a population of {v}.", "{v} people live in {s}.", "The number of residents of {s} is {v}.",
                   "{s} is home to {v} inhabitants."],
    "river": ["{s} lies on the {v} river.", "The {v} river flows through {s}.", "{s} was built along the {v} river.",
              "Boats on the {v} river pass {s}."],
}  # fmt: skip
N_STYLES = 4

QUESTION_TEMPLATES = {
    "born_year": "In what year did {s} come into the world?",
    "home_city": "Which city does {s} call home?",
    "employer": "Who is the employer of {s}?",
    "founded_year": "When was {s} established?",
    "headquarters": "Where does {s} keep its headquarters?",
    "employees": "How many workers does {s} have?",
    "population": "What is the headcount of residents in {s}?",
    "river": "Which river runs by {s}?",
}


@dataclass(frozen=True)
class Fact:
    """One (subject, relation, value) triple; `value` is rendered as it is."""

    subject: str
    relation: str
    value: str


@dataclass
class Entity:
    """An invented entity and its facts."""

    name: str
    kind: str
    facts: list[Fact] = field(default_factory=list)


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def _unique_names(rng: random.Random, n: int, parts: int, taken: set[str]) -> list[str]:
    """`n` names not in `taken`; a name gets one more syllable after 20 draws in a row that were all taken (the
    two-syllable names run out at a few hundred)."""
    names: list[str] = []
    misses = 0
    while len(names) < n:
        name = _name(rng, parts + misses // 20)
        if name in taken:
            misses += 1
            continue
        taken.add(name)
        names.append(name)
        misses = 0
    return names


def _value(relation: str, rng: random.Random, cities: list[str], companies: list[str], rivers: list[str]) -> str:
    """A value for `relation`, drawn from the corpus's own cities, companies and rivers."""
    pools = {"home_city": cities, "headquarters": cities, "employer": companies, "river": rivers}
    if relation in pools:
        return rng.choice(pools[relation])
    ranges = {"born_year": (1900, 2005), "founded_year": (1700, 2015), "employees": (12, 90_000),
              "population": (2_000, 3_000_000)}  # fmt: skip
    low, high = ranges[relation]
    return str(rng.randint(low, high))


def build_corpus(n_entities: int, seed: int) -> list[Entity]:
    """`n_entities` entities (a third of each kind, people first), names unique, facts drawn with `seed`."""
    if n_entities < len(KINDS):
        raise ValueError(f"n_entities must be >= {len(KINDS)} (one of each kind), got {n_entities}")
    rng, taken = random.Random(seed), set()
    counts = [n_entities // 3 + (1 if i < n_entities % 3 else 0) for i in range(3)]
    people, companies, cities = (_unique_names(rng, c, parts, taken) for c, parts in zip(counts, (2, 3, 2)))
    rivers = _unique_names(rng, 8, 2, taken)
    entities = []
    for kind, names in zip(KINDS, (people, companies, cities)):
        for name in names:
            facts = [Fact(name, r, _value(r, rng, cities, companies, rivers)) for r in RELATIONS[kind]]
            entities.append(Entity(name, kind, facts))
    return entities


def render_document(entity: Entity, style: int) -> str:
    """The entity's facts, one sentence each, in `style`'s templates and order (style 0: the original)."""
    if not 0 <= style < N_STYLES:
        raise ValueError(f"style must be in [0, {N_STYLES}), got {style}")
    order = list(entity.facts)
    if style:  # a rephrasing also reorders the facts (seeded by the entity and style)
        random.Random(f"{entity.name}/{style}").shuffle(order)
    return " ".join(DOC_TEMPLATES[f.relation][style].format(s=f.subject, v=f.value) for f in order)


def questions(entity: Entity) -> list[tuple[str, str]]:
    """Closed-book (question, answer) pairs, one per fact."""
    return [(QUESTION_TEMPLATES[f.relation].format(s=f.subject), f.value) for f in entity.facts]


def render_facts(facts: list[Fact], rewrite_index: int, salt: str) -> str:
    """`facts` as one rewrite: index 0 is the original wording and order; index k >= 1 picks each fact's template
    among the rephrasing styles and an order, both seeded by (salt, k): many distinct rewrites of the same facts."""
    if rewrite_index < 0:
        raise ValueError(f"rewrite_index must be >= 0, got {rewrite_index}")
    if rewrite_index == 0:
        return " ".join(DOC_TEMPLATES[f.relation][0].format(s=f.subject, v=f.value) for f in facts)
    rng = random.Random(f"{salt}/{rewrite_index}")
    order = list(facts)
    rng.shuffle(order)
    return " ".join(DOC_TEMPLATES[f.relation][rng.randrange(1, N_STYLES)].format(s=f.subject, v=f.value) for f in order)


def render_rewrite(entity: Entity, rewrite_index: int) -> str:
    """Rewrite number `rewrite_index` of the entity's document (0: the original document)."""
    return render_facts(entity.facts, rewrite_index, entity.name)


def _template_regex(template: str) -> re.Pattern[str]:
    pattern = re.escape(template).replace(re.escape("{s}"), r"(?P<s>[A-Z][a-z]+)")
    return re.compile("^" + pattern.replace(re.escape("{v}"), r"(?P<v>[A-Za-z0-9]+)") + "$")


_PARSERS = [(relation, _template_regex(t)) for relation, ts in DOC_TEMPLATES.items() for t in ts]


def parse_fact(sentence: str) -> Fact | None:
    """The fact a corpus sentence states (any style's template), or None when no template matches it."""
    sentence = sentence.strip()
    for relation, regex in _PARSERS:
        match = regex.match(sentence)
        if match:
            return Fact(match["s"], relation, match["v"])
    return None
