"""Values made from a JSON schema: what the schema-driven tool simulator answers with.

For any tool spec, `sample_value` draws a value valid against a schema (enum, const, anyOf/oneOf,
string formats, `pattern`s, numeric and length bounds, arrays, nested objects), deterministic given the RNG;
`conform` keeps the fields an existing record already has and fills the rest, so a simulator's
answers stay consistent with its state; `inline_refs` resolves a schema's local `$ref`s
(`#/$defs/...`, `#/definitions/...`) so that the checkers and the generator see plain schemas.

A `pattern` is met by generating from the regex (`pattern_string`: literals, classes, `\\d \\w \\s`, groups,
alternation, quantifiers, anchors); one it cannot meet (lookarounds, backreferences, or lengths that conflict
with it) is listed by `unsatisfiable_patterns`, and the task templates leave such a tool out (spec_templates.py).

    rng = random.Random(0)
    sample_value({"type": "integer", "minimum": 3, "maximum": 5}, rng)          # 3, 4 or 5
    output_schema = {"type": "object", "properties": {"city": {"type": "string"}, "temp": {"type": "number"}}}
    conform({"city": "Paris"}, output_schema, rng)                              # {"city": "Paris", "temp": 41.57}
"""

from __future__ import annotations

import math
import random
import re
import string
from typing import Any

try:  # the regex parser of the standard library (its module name since Python 3.11)
    import re._constants as sre
    import re._parser as sre_parse
except ImportError:  # pragma: no cover
    import sre_constants as sre  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

from k2post.toolsets.schema import MAX_PATTERN_REPEAT, bound, check_value, pattern_problem, pattern_search

MAX_DEPTH = 6
"""Nesting depth past which a recursive schema stops expanding (an empty object or list)."""
MAX_SCHEMA_NODES = 5000
"""Most objects and lists a tool's schema may have once its `$ref`s are inlined."""
MAX_SCHEMA_NESTING = 64
"""Deepest nesting of objects and lists in a tool's schema."""
MAX_MIN_LENGTH = 10_000
"""Largest `minLength` a spec may ask for (the simulator writes strings that long)."""
MAX_MIN_ITEMS = 100
"""Largest `minItems` a spec may ask for (the simulator writes arrays that long)."""
MAX_VALUE_NODES = 100_000
"""Most values one simulated value of a tool's schema may hold (nested arrays multiply their minItems)."""

WORDS = (
    "amber", "birch", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
    "kestrel", "lumen", "maple", "nova", "onyx", "pine", "quartz", "river", "sierra", "tundra",
)  # fmt: skip
NAMED_VALUES: dict[str, tuple[str, ...]] = {
    "city": ("Paris", "Lisbon", "Nairobi", "Osaka", "Denver", "Oslo", "Lima", "Hanoi"),
    "timezone": ("Europe/Paris", "America/New_York", "Asia/Tokyo", "Africa/Nairobi", "Australia/Sydney", "UTC"),
    "country": ("France", "Kenya", "Japan", "Peru", "Norway", "Canada"),
    "language": ("English", "French", "Japanese", "Swahili", "Spanish"),
    "state": ("CA", "NY", "TX", "WA", "CO", "FL"),
    "color": ("red", "green", "blue", "yellow", "purple"),
    "status": ("open", "pending", "closed"),
    "weather": ("sunny", "cloudy", "light rain", "snow", "windy", "fog"),
    "conditions": ("sunny", "cloudy", "light rain", "snow", "windy", "fog"),
    "currency": ("EUR", "USD", "JPY", "KES", "NOK"),
}
"""Realistic strings for common property names (the name's last word picks the list)."""


def _local_ref(root: dict[str, Any], ref: str) -> Any:
    """The schema a local `#/...` reference points at, or None."""
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


class SchemaTooLarge(ValueError):
    """A schema expands past `MAX_SCHEMA_NODES` nodes or nests deeper than `MAX_SCHEMA_NESTING` (a `$ref` fan-out)."""


def inline_refs(schema: Any, root: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """`schema` with local `$ref`s replaced by what they point at (recursion stops at MAX_DEPTH with
    `{}`: any value); `$defs`/`definitions` are dropped from the result. Unresolvable refs become `{}`.
    SchemaTooLarge when the result would have more than MAX_SCHEMA_NODES objects and lists (forty properties
    referring to the same definition at each of six levels are 40**6) or nest deeper than MAX_SCHEMA_NESTING."""
    return _inline(schema, schema if root is None else root, depth, 0, [MAX_SCHEMA_NODES])


def _inline(schema: Any, root: dict[str, Any], depth: int, level: int, budget: list[int]) -> Any:
    if not isinstance(schema, (dict, list)):
        return schema
    budget[0] -= 1
    if budget[0] < 0:
        raise SchemaTooLarge(f"expands to more than {MAX_SCHEMA_NODES} schema nodes (a $ref fan-out?)")
    if level > MAX_SCHEMA_NESTING:
        raise SchemaTooLarge(f"nests deeper than {MAX_SCHEMA_NESTING} levels")
    if isinstance(schema, list):
        return [_inline(item, root, depth, level + 1, budget) for item in schema]
    if "$ref" in schema:
        target = _local_ref(root, schema["$ref"]) if isinstance(schema["$ref"], str) else None
        if target is None or depth >= MAX_DEPTH:
            return {}
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _inline({**target, **rest}, root, depth + 1, level, budget)
    kept = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}
    return {k: _inline(v, root, depth, level + 1, budget) for k, v in kept.items()}


def _subschemas(schema: dict[str, Any], where: str) -> list[tuple[Any, str]]:
    """(child schema, its path) of every place a schema nests one: properties, items, alternatives, extras."""
    children = [(sub, f"{where}.properties.{key}") for key, sub in (schema.get("properties") or {}).items()]
    children += [(schema.get(key), f"{where}.{key}") for key in ("items", "additionalProperties")]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        children += [(sub, f"{where}.{key}[{i}]") for i, sub in enumerate(options if isinstance(options, list) else [])]
    return [(sub, path) for sub, path in children if isinstance(sub, dict)]


def _own_limit_problem(schema: dict[str, Any], where: str) -> str | None:
    """A `pattern`, size minimum or numeric bound of one schema node that the generator cannot honour safely."""
    if "pattern" in schema:
        problem = pattern_problem(schema["pattern"])
        if problem:
            return f"{where}.pattern: {problem}"
    for key, cap in (("minLength", MAX_MIN_LENGTH), ("minItems", MAX_MIN_ITEMS)):
        value = schema.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= cap):
            return f"{where}.{key}: {value!r} is not a count from 0 to {cap} (the simulator makes values that long)"
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        value = bound(schema, key)
        if value is not None and not math.isfinite(value):
            return f"{where}.{key}: {value!r} is not a finite number"
    return None


def limit_problem(schema: Any, where: str) -> str | None:
    """The first thing in a tool's (inlined) schema that would make checking or simulating it unbounded: an
    invalid or oversized `pattern`, a `minLength`/`minItems` over its cap, an infinite bound, or a smallest
    simulated value of more than MAX_VALUE_NODES values; None when it is bounded."""
    pending = [(schema, where)]
    while pending:
        node, path = pending.pop()
        if not isinstance(node, dict):
            continue
        problem = _own_limit_problem(node, path)
        if problem:
            return problem
        pending += _subschemas(node, path)
    size = value_size(schema)
    if size > MAX_VALUE_NODES:
        return f"{where}: a simulated value would hold more than {MAX_VALUE_NODES} values (minItems of nested arrays?)"
    return None


def value_size(schema: Any, depth: int = 0) -> int:
    """At most how many values `sample_value` (complete objects) makes for `schema` (capped past MAX_VALUE_NODES)."""
    if not isinstance(schema, dict):
        return 1
    options = [o for o in schema.get("anyOf") or schema.get("oneOf") or [] if isinstance(o, dict)]
    if options:
        return min(MAX_VALUE_NODES + 1, max(value_size(option, depth) for option in options))
    kind = schema_kind(schema)
    if kind == "object" and depth < MAX_DEPTH:
        subs = [sub for sub in (schema.get("properties") or {}).values() if isinstance(sub, dict)]
        return min(MAX_VALUE_NODES + 1, 1 + sum(value_size(sub, depth + 1) for sub in subs))
    if kind == "array":
        low = schema.get("minItems", 1)
        count = max(low if isinstance(low, int) else 1, 3)
        return min(MAX_VALUE_NODES + 1, 1 + count * value_size(schema.get("items"), depth + 1))
    return 1


def schema_kind(schema: dict[str, Any]) -> str:
    """The JSON type a schema asks for (the first non-null of a type list; inferred when absent)."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if isinstance(kind, str):
        return kind
    if "properties" in schema:
        return "object"
    return "array" if "items" in schema else "string"


def _options(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of an anyOf/oneOf schema."""
    options = schema.get("anyOf") or schema.get("oneOf") or []
    usable = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
    return usable or [o for o in options if isinstance(o, dict)]


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float, float]:
    """(low, high) of a number schema; defaults 1..100 around whichever bound is given."""
    step = 1 if integer else 0.01
    low, high = bound(schema, "minimum"), bound(schema, "maximum")
    above, below = bound(schema, "exclusiveMinimum"), bound(schema, "exclusiveMaximum")
    low = above + step if low is None and above is not None else low
    high = below - step if high is None and below is not None else high
    if low is None:
        low = min(1, high - 99) if high is not None else 1
    if high is None:
        high = low + 99
    return low, max(low, high)


def _format_string(fmt: str, rng: random.Random) -> str | None:
    """A string of a JSON-schema `format`, or None for formats without a generator."""
    day = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    hour = f"{rng.randint(0, 23):02d}:{rng.choice((0, 15, 30, 45)):02d}"
    made = {
        "date": day,
        "date-time": f"{day}T{hour}:00Z",
        "time": f"{hour}:00",
        "email": f"{rng.choice(WORDS)}{rng.randint(1, 99)}@example.com",
        "uri": f"https://example.com/{rng.choice(WORDS)}/{rng.randint(1, 999)}",
        "url": f"https://example.com/{rng.choice(WORDS)}/{rng.randint(1, 999)}",
        "uuid": "%08x-%04x-4%03x-8%03x-%012x" % tuple(rng.getrandbits(b) for b in (32, 16, 12, 12, 48)),
        "ipv4": ".".join(str(rng.randint(1, 254)) for _ in range(4)),
        "hostname": f"{rng.choice(WORDS)}.example.com",
    }
    return made.get(fmt)


PATTERN_DRAWS = 100
"""Strings drawn from a pattern before it counts as one the generator cannot meet (with the length bounds)."""
REPEAT_EXTRA = 3
"""An open-ended quantifier (`*`, `+`, `{m,}`) repeats at most this many times past its minimum (plus the
string's minLength, which may need more)."""
MAX_GENERATED_CHARS = 10_000
"""Longest string drawn from a pattern (past it the pattern counts as one the generator cannot meet)."""
POOL = string.ascii_letters + string.digits + " -_.:/@"
"""Characters drawn for `.` and negated classes."""


class UnsupportedPattern(ValueError):
    """A regex construct the generator does not produce (lookaround, backreference, ...)."""


def _in_class(char: str, items: list[tuple[Any, Any]]) -> bool:
    """Whether `char` is in a parsed character class (its NEGATE item aside)."""
    tests = {
        sre.CATEGORY_DIGIT: str.isdigit,
        sre.CATEGORY_NOT_DIGIT: lambda c: not c.isdigit(),
        sre.CATEGORY_WORD: lambda c: c.isalnum() or c == "_",
        sre.CATEGORY_NOT_WORD: lambda c: not (c.isalnum() or c == "_"),
        sre.CATEGORY_SPACE: str.isspace,
        sre.CATEGORY_NOT_SPACE: lambda c: not c.isspace(),
    }
    for op, av in items:
        hit = (
            (op is sre.LITERAL and ord(char) == av)
            or (op is sre.RANGE and av[0] <= ord(char) <= av[1])
            or (op is sre.CATEGORY and av in tests and tests[av](char))
        )
        if hit:
            return True
    return False


def _class_char(items: list[tuple[Any, Any]], rng: random.Random) -> str:
    """A character of a parsed class `[...]`."""
    negate = bool(items) and items[0][0] is sre.NEGATE
    members = items[1:] if negate else items
    if not negate:
        op, av = rng.choice(members)
        if op is sre.LITERAL:
            return chr(av)
        if op is sre.RANGE:
            return chr(rng.randint(*av))
    pool = [c for c in POOL if _in_class(c, members) != negate]
    if not pool:
        raise UnsupportedPattern("empty character class")
    return rng.choice(pool)


def _emit(items: Any, rng: random.Random, out: list[str], extra: int = REPEAT_EXTRA) -> None:
    """Append to `out` a string the parsed regex `items` matches (open repeats: at most `extra` past the minimum)."""
    for op, av in items:
        if op is sre.LITERAL:
            out.append(chr(av))
        elif op is sre.NOT_LITERAL:
            out.append(rng.choice([c for c in POOL if ord(c) != av]))
        elif op is sre.ANY:
            out.append(rng.choice(POOL))
        elif op is sre.IN:
            out.append(_class_char(av, rng))
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
            low, high, sub = av
            if low > MAX_PATTERN_REPEAT or len(out) > MAX_GENERATED_CHARS:
                raise UnsupportedPattern(f"repeats {low} times")
            for _ in range(rng.randint(low, min(high, low + extra))):
                _emit(sub, rng, out, extra)
        elif op is sre.SUBPATTERN:
            _emit(av[-1], rng, out, extra)
        elif op is sre.BRANCH:
            _emit(rng.choice(av[1]), rng, out, extra)
        elif op is not sre.AT:  # anchors need nothing; the result is checked against the pattern anyway
            raise UnsupportedPattern(str(op))


def pattern_string(pattern: str, rng: random.Random, low: int = 0, high: int | None = None) -> str | None:
    """A string that `pattern` matches (re.search, as JSON Schema reads it) with low <= length <= high, or None
    when the generator cannot make one (an unsupported construct, or bounds that conflict with the pattern)."""
    try:
        parsed = sre_parse.parse(pattern)
        for _ in range(PATTERN_DRAWS):
            out: list[str] = []
            _emit(parsed, rng, out, REPEAT_EXTRA + low)  # a minLength may need longer repeats
            text = "".join(out)
            if low <= len(text) <= (high if high is not None else len(text)) and pattern_search(pattern, text):
                return text
    except (re.error, UnsupportedPattern, RecursionError):
        return None
    return None


def unsatisfiable_patterns(schema: Any, path: str) -> list[str]:
    """`path.field: pattern '...'` for every string `pattern` in `schema` (properties, items, anyOf/oneOf) that
    `pattern_string` cannot meet with its length bounds."""
    if isinstance(schema, list):
        return [found for item in schema for found in unsatisfiable_patterns(item, path)]
    if not isinstance(schema, dict):
        return []
    found = []
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and _pattern_text(schema, random.Random(0)) is None:
        found.append(f"{path}: pattern '{pattern}'")
    for key, sub in (schema.get("properties") or {}).items():
        found += unsatisfiable_patterns(sub, f"{path}.{key}")
    found += unsatisfiable_patterns(schema.get("items"), f"{path}[]")
    for key in ("anyOf", "oneOf"):
        found += unsatisfiable_patterns(schema.get(key), path)
    return found


def _pattern_text(schema: dict[str, Any], rng: random.Random) -> str | None:
    high = schema.get("maxLength")
    return pattern_string(schema["pattern"], rng, schema.get("minLength", 0), high if isinstance(high, int) else None)


def _string(schema: dict[str, Any], rng: random.Random, name: str) -> str:
    """A string honouring format, pattern, min/maxLength; realistic for common property names."""
    last = name.lower().split("_")[-1] if name else ""
    text = _format_string(str(schema.get("format", "")), rng)
    if text is None:
        named = NAMED_VALUES.get(last)
        text = rng.choice(named) if named else f"{rng.choice(WORDS)}-{rng.randint(10, 99)}"
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    text = text + "x" * max(0, low - len(text))
    text = text[:high] if isinstance(high, int) else text
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and check_value(name or "value", text, schema) is not None:
        text = _pattern_text(schema, rng) or text  # unmeetable: left as is (templates skip such tools)
    return text


def _array(schema: dict[str, Any], rng: random.Random, name: str, depth: int) -> list[Any]:
    low = schema.get("minItems", 1 if depth == 0 else 0)
    high = min(schema.get("maxItems", 3), max(low, 3))
    items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
    count = low if depth >= MAX_DEPTH // 2 else rng.randint(low, max(low, high))  # deep (recursive): the fewest
    return [sample_value(items, rng, name.removesuffix("s"), depth + 1) for _ in range(count)]


def _object(schema: dict[str, Any], rng: random.Random, depth: int, complete: bool) -> dict[str, Any]:
    """Required properties always; optional ones always when `complete`, else half the time."""
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    if depth >= MAX_DEPTH:
        return {}
    return {
        key: sample_value(sub, rng, key, depth + 1, complete)
        for key, sub in properties.items()
        if isinstance(sub, dict) and (key in required or complete or rng.random() < 0.5)
    }


def sample_value(schema: Any, rng: random.Random, name: str = "", depth: int = 0, complete: bool = False) -> Any:
    """A value valid against `schema` (refs inlined first); `name` (the property's) picks realistic strings;
    `complete`: objects get every property, not only the required ones."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    if schema.get("anyOf") or schema.get("oneOf"):
        return sample_value(rng.choice(_options(schema)), rng, name, depth, complete)
    examples = schema.get("examples")
    if isinstance(examples, list) and examples and check_value(name or "value", examples[0], schema) is None:
        return rng.choice(examples)
    kind = schema_kind(schema)
    if kind in ("integer", "number"):
        low, high = _bounds(schema, kind == "integer")
        if kind == "integer":
            return rng.randint(math.ceil(low), max(math.ceil(low), math.floor(high)))
        return round(rng.uniform(low, high), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        return _array(schema, rng, name, depth)
    if kind == "object":
        return _object(schema, rng, depth, complete)
    return _string(schema, rng, name)


def conform(record: dict[str, Any], schema: dict[str, Any], rng: random.Random) -> Any:
    """A value valid against an output `schema` that keeps every field of `record` the schema accepts
    (so answers agree with the simulator's state) and fills the rest with sampled values."""
    if schema_kind(schema) != "object" or schema.get("anyOf") or schema.get("oneOf"):
        return sample_value(schema, rng, complete=True)
    properties = schema.get("properties") or {}
    closed = schema.get("additionalProperties") is False
    value = {}
    for key, sub in properties.items():
        have = key in record and check_value(key, record[key], sub if isinstance(sub, dict) else {}) is None
        value[key] = record[key] if have else sample_value(sub, rng, key, 1, complete=True)
    extra = schema.get("additionalProperties")
    if not closed:
        value.update(
            {
                k: v
                for k, v in record.items()
                if k not in properties and (not isinstance(extra, dict) or check_value(k, v, extra) is None)
            }
        )
    return value
