"""Fuzzing environments: hypothesis strategies for hostile model output, and robustness checks.

Built-in environments must score anything a policy can write without raising, and stay
inside their declared `reward_range`. The strategies cover random text, odd unicode,
numbers (huge, nan, inf), `\\boxed{` fragments and nesting, K2 tool-call tokens wrapped
around junk JSON, think tags and code fences; `edge_cases()` adds fixed nasties including a
1 MB string. Multi-turn envs are also stepped with random (often invalid) tool calls.

    from hypothesis import given
    from k2post.envs.fuzz import responses, check_reward

    @given(responses())
    def test_my_env(response):
        check_reward(env, env.score(task, response))

The repository's own fuzz test (every registered env): tests/k2post/envs/test_env_fuzz.py,
run with `.venv/bin/python -m pytest tests/k2post/envs/test_env_fuzz.py -q`; set
K2POST_FUZZ_EXAMPLES to run more examples per env.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from hypothesis import strategies as st

from k2post.chat.tokens import (
    EOS,
    IM_ASSISTANT,
    IM_END,
    IM_MIDDLE,
    IM_SYSTEM,
    IM_USER,
    THINK_BEGIN,
    THINK_END,
    TOOL_CALL_ARG_BEGIN,
    TOOL_CALL_BEGIN,
    TOOL_CALL_END,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
)
from k2post.chat.types import Message, ToolCall
from k2post.envs.base import Environment, Reward

ONE_MB = 1 << 20


class FuzzFailure(AssertionError):
    """An environment misbehaved on fuzzed input (raised, returned a non-Reward, left its range)."""


CASES_RUN: dict[str, dict[str, int]] = {}
"""Fuzz cases run in this process: env name -> {"direct": n, "episodes": n, "pool": n} (the tests fill it)."""
SPECIAL_TOKENS = [
    IM_USER,
    IM_ASSISTANT,
    IM_SYSTEM,
    IM_MIDDLE,
    IM_END,
    EOS,
    TOOL_CALLS_BEGIN,
    TOOL_CALLS_END,
    TOOL_CALL_BEGIN,
    TOOL_CALL_ARG_BEGIN,
    TOOL_CALL_END,
    THINK_BEGIN,
    THINK_END,
]
ODD_CHARS = ["\x00", "\u200b", "\u202e", "\ufeff", "\u0301", "\U0001f600", "\r", "\t", "\\", "{", "}", "$", "`"]
NASTY_NUMBERS = [
    "1e999999",
    "-0",
    "0x1F",
    "1/0",
    "\\frac{1}{0}",
    "2^{2^{2^{2^{2}}}}",
    "10**10**10",
    "9" * 400 + "!",
    "NaN",
    "∞",
    "1,000,000",
    "٣",
]
NUMBER_FRAMES = ["<n>", "The answer is <n>", "\\boxed{<n>}", "#### <n>", "x = <n>", "<n> <n>", "$$<n>$$"]
LATEX_PIECES = [
    "\\boxed{",
    "}",
    "{",
    "\\boxed{}",
    "\\frac{",
    "\\sqrt{",
    "\\left(",
    "\\right)",
    "^{",
    "_",
    "\\",
    "\\text{",
    "\\boxed",
]
BAD_JSON = ["{", '{"a":', "{'a': 1}", "NaN", '{"n": 1e999}', "[]", ""]
TOOL_NAMES = ["add", "search", "read_file", "", "functions.x", "a b"]
CODE_BODIES = ["import os\nos._exit(0)", "while True: pass", "print(1/0)", "def f(:", "```"]


def unicode_text(max_size: int = 200) -> st.SearchStrategy[str]:
    """Any encodable unicode (no lone surrogates), salted with control/zero-width/RTL chars."""
    alphabet = st.one_of(st.characters(codec="utf-8"), st.sampled_from(ODD_CHARS))
    return st.text(alphabet=alphabet, max_size=max_size)


def number_strings() -> st.SearchStrategy[str]:
    """Numbers as a model might write them: ints, floats, nan/inf, huge, LaTeX, with noise."""
    numbers = st.one_of(
        st.integers().map(str),
        st.integers(min_value=-(10**400), max_value=10**400).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(NASTY_NUMBERS),
    )
    return st.builds(lambda frame, n: frame.replace("<n>", n), st.sampled_from(NUMBER_FRAMES), numbers)


def boxed_fragments() -> st.SearchStrategy[str]:
    """Broken and deeply nested `\\boxed{` constructs."""
    pieces = st.lists(st.one_of(st.sampled_from(LATEX_PIECES), unicode_text(8)), max_size=40).map("".join)
    nested = st.integers(min_value=1, max_value=400).map(lambda d: "\\boxed{" * d + "1" + "}" * (d // 2))
    return st.one_of(pieces, nested)


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20))
    return st.recursive(
        scalars,
        lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
        max_leaves=12,
    )


def junk_json() -> st.SearchStrategy[str]:
    """JSON-ish argument text: valid non-objects, objects, and truncated/mangled ones."""
    dumped = _json_values().map(lambda v: json.dumps(v, ensure_ascii=False))
    cut = st.builds(lambda text, k: text[: max(0, len(text) - k)], dumped, st.integers(min_value=1, max_value=6))
    return st.one_of(dumped, cut, st.sampled_from(BAD_JSON), unicode_text(30))


def _call_ids() -> st.SearchStrategy[str]:
    names = st.one_of(st.sampled_from(TOOL_NAMES), st.text(max_size=12))
    indexes = st.one_of(st.integers(-2, 99).map(str), st.text(max_size=3))
    return st.builds(lambda name, idx: f"functions.{name}:{idx}", names, indexes)


def tool_call_text() -> st.SearchStrategy[str]:
    """K2 tool-call sections with junk JSON, bad ids and randomly dropped or repeated tokens."""
    call = st.builds(
        lambda cid, args: TOOL_CALL_BEGIN + cid + TOOL_CALL_ARG_BEGIN + args + TOOL_CALL_END, _call_ids(), junk_json()
    )
    section = st.lists(call, max_size=4).map(lambda calls: TOOL_CALLS_BEGIN + "".join(calls) + TOOL_CALLS_END)
    scrambled = st.lists(st.one_of(st.sampled_from(SPECIAL_TOKENS), junk_json(), _call_ids()), max_size=12).map("".join)
    return st.builds(lambda pre, body: pre + body, unicode_text(40), st.one_of(section, scrambled))


def code_fences() -> st.SearchStrategy[str]:
    """Markdown code fences around junk (code envs), some unterminated."""
    langs = st.sampled_from(["", "python", "py", "bash", "json"])
    bodies = st.one_of(unicode_text(60), st.sampled_from(CODE_BODIES))
    return st.builds(
        lambda lang, body, close: f"```{lang}\n{body}" + ("\n```" if close else ""), langs, bodies, st.booleans()
    )


def think_wrapped() -> st.SearchStrategy[str]:
    """`<think>` reasoning, closed or not, before an answer-like tail."""
    tail = st.one_of(number_strings(), boxed_fragments(), st.text(max_size=40))
    return st.builds(
        lambda a, b, close: THINK_BEGIN + a + (THINK_END if close else "") + b, unicode_text(40), tail, st.booleans()
    )


def responses() -> st.SearchStrategy[str]:
    """Any of the hostile response kinds above (plain text included)."""
    return st.one_of(
        st.text(max_size=200),
        unicode_text(),
        number_strings(),
        boxed_fragments(),
        tool_call_text(),
        code_fences(),
        think_wrapped(),
    )


def edge_cases() -> list[str]:
    """Fixed hostile responses, including one 1 MB string (run once per env)."""
    unclosed_call = TOOL_CALLS_BEGIN + TOOL_CALL_BEGIN + "functions.add:0" + TOOL_CALL_ARG_BEGIN + "{" * 2000
    return [
        "",
        " ",
        "\n" * 1000,
        "\x00",
        "\\boxed{",
        "\\boxed{}" * 2000,
        "{" * 5000,
        "}" * 5000,
        "\\boxed{" * 3000 + "}" * 3000,
        "9" * 20000,
        "\\boxed{" + "9" * 5000 + "}",
        "\\boxed{10^{10^{10^{10}}}}",
        "\\boxed{2**2**2**2**2**2}",
        "\\boxed{99999!}",
        "\\boxed{nan}",
        "\\boxed{\\infty}",
        "1e308 * 10",
        TOOL_CALLS_BEGIN * 500,
        unclosed_call,
        THINK_BEGIN * 100,
        "```python\nimport os\nos._exit(0)\n```",
        "```python\nwhile True: pass\n```",
        "\ud7ff\ufffd\U0010ffff",
        "\u202e\u0301" * 1000,
        big_response(),
        *bomb_cases(),
    ]


SLOW_MATH = [
    "\\boxed{\\binom{10^6}{5 \\cdot 10^5}}",
    "\\boxed{(9999^{9999})^{9999}}",
    "\\boxed{{9999^{9999}}^{9999}}",
    "\\boxed{\\Gamma(1000000)}",
    "\\boxed{" + "(" * 140 + "1" + ")" * 140 + "}",
]
"""Answers that ran math-verify for 7 s to minutes (one C bigint operation that no signal interrupts): a math scorer
must prove an answer small before it runs it in its own process, and run the rest in a child it can kill."""


def bomb_cases() -> list[str]:
    """Inputs that once hung or crashed a scorer: deep JSON (raw and inside a closed tool call), LaTeX and
    factorial bombs for sympy, and floods of code fences without a newline (quadratic extraction)."""
    deep_call = (
        TOOL_CALLS_BEGIN + TOOL_CALL_BEGIN + "functions.add:0" + TOOL_CALL_ARG_BEGIN
        + '{"numbers": ' + "[" * 5000 + "]" * 5000 + "}" + TOOL_CALL_END + TOOL_CALLS_END
    )  # fmt: skip
    return [
        '{"a": ' * 3000 + "1" + "}" * 3000,
        "[" * 100_000 + "]" * 100_000,
        deep_call,
        "\\boxed{\\binom{1000000}{500000}}",
        "\\boxed{{1000000 \\choose 500000}}",
        "\\boxed{10!!!!!!!!}",
        "\\boxed{(100!)!}",
        "\\boxed{999!!}",
        "The answer is \\dbinom{99999}{4000}.",
        *SLOW_MATH,
        "```" * 100_000,
        "```python" * 30_000,
        "``` \n" * 50_000,
    ]


NON_STRING_RESPONSES: list[Any] = [None, 0, 3.5, True, [], ["x"], {}, {"role": "assistant", "content": 1}, b"bytes"]
"""What a buggy caller may pass instead of text: scorers must treat it as (bad) text, not raise."""
MAX_SCORE_CPU_S = 1.0
"""Most CPU seconds one direct `score` may take (the scorer's own process; a sandbox child is bounded by its
own limits)."""


def big_response(size: int = ONE_MB) -> str:
    """A ~1 MB response: mixed text, numbers, braces and tool-call tokens, repeated."""
    chunk = "The answer is 42. \\boxed{7} {[(" + TOOL_CALL_BEGIN + "é漢字 \u200b 3.14159 " * 3 + "\n"
    return (chunk * (size // len(chunk) + 1))[:size]


def _tool_calls(names: st.SearchStrategy[str]) -> st.SearchStrategy[list[ToolCall]]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30))
    args = st.dictionaries(st.sampled_from(["n", "path", "query", "id", "amount", "x", ""]), scalars, max_size=4)
    return st.lists(st.tuples(names, args), max_size=3).map(
        lambda pairs: [ToolCall(id=f"functions.{n}:{i}", name=n, arguments=a) for i, (n, a) in enumerate(pairs)]
    )


def tool_messages(tool_names: list[str]) -> st.SearchStrategy[Message]:
    """Assistant messages with random (mostly invalid) tool calls, for multi-turn envs."""
    junk_names = st.one_of(st.sampled_from(["nope", "x" * 300]), st.text(min_size=1, max_size=12))
    names = st.one_of(st.sampled_from(tool_names or ["missing"]), junk_names)
    return st.builds(
        lambda text, calls: Message(role="assistant", content=text, tool_calls=calls),
        st.text(max_size=60),
        _tool_calls(names),
    )


def check_reward(env: Environment | type[Environment], reward: Any) -> Reward:
    """`reward` if it is a Reward with a finite value inside env.reward_range; FuzzFailure otherwise."""
    if not isinstance(reward, Reward):
        raise FuzzFailure(f"{env.name}: returned {type(reward).__name__}, expected Reward")
    low, high = env.reward_range
    if not (math.isfinite(reward.value) and low - 1e-9 <= reward.value <= high + 1e-9):
        raise FuzzFailure(f"{env.name}: reward {reward.value!r} outside reward_range [{low}, {high}]")
    return reward


def score_checked(env: Environment, task: Any, response: Any) -> Reward:
    """env.score must not raise on any response, must stay in range, and must take at most MAX_SCORE_CPU_S
    of this process's CPU time."""
    started = time.process_time()
    try:
        reward = env.score(task, response)
    except Exception as err:
        what = f"{type(err).__name__}: {err}"
        raise FuzzFailure(f"{env.name}: score raised {what} on response {repr(response)[:80]}") from err
    spent = time.process_time() - started
    if spent > MAX_SCORE_CPU_S:
        raise FuzzFailure(f"{env.name}: score took {spent:.1f} s of CPU on response {repr(response)[:80]}")
    return check_reward(env, reward)


def episode_checked(env: Environment, task: Any, turns: list[Message]) -> Reward:
    """reset/step/score_state must not raise on random tool calls (stops at done/max_turns)."""
    try:
        state = env.reset(task)
        for turn in turns[: getattr(env, "max_turns", len(turns))]:
            if env.step(state, turn).done:
                break
        reward = env.score_state(task, state)
    except Exception as err:
        raise FuzzFailure(f"{env.name}: episode raised {type(err).__name__}: {err}") from err
    return check_reward(env, reward)
