"""Rubric files and task rubrics: the shipped files load, malformed input fails on one clear line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from k2post.envs.base import Task
from k2post_rubrics.schema import DATA_DIR, Rubric, RubricFileError, builtin_rubrics, load_rubric_file, task_rubrics

GOOD_ENTRY = "  - name: {name}\n    title: T\n    text: Check this.\n"


def _write(tmp_path, text: str):
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_core_and_prescriptive():
    core = builtin_rubrics(["core"])
    prescriptive = builtin_rubrics(["prescriptive"])
    assert [r.name for r in core] == ["clarity_relevance", "conversational_fluency", "objective_grounded"]
    assert [r.name for r in prescriptive] == ["no_initial_praise", "no_self_justification"]
    assert {r.kind for r in core} == {"core"} and {r.kind for r in prescriptive} == {"prescriptive"}
    for rubric in core + prescriptive:
        sentences = [s for s in rubric.text.replace("!", ".").split(". ") if s.strip()]
        assert 2 <= len(sentences) <= 4, rubric.name
    assert builtin_rubrics() == core + prescriptive
    assert builtin_rubrics(["task"]) == []


def test_shipped_files_sit_in_the_package():
    assert (DATA_DIR / "core.yaml").is_file() and (DATA_DIR / "prescriptive.yaml").is_file()
    assert DATA_DIR.parent.name == "rubrics"


def test_builtin_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown rubric kind 'style'"):
        builtin_rubrics(["style"])


def test_load_good_file(tmp_path):
    path = _write(tmp_path, "kind: task\nrubrics:\n" + GOOD_ENTRY.format(name="a") + GOOD_ENTRY.format(name="b"))
    rubrics = load_rubric_file(path)
    assert [(r.name, r.kind, r.title, r.text) for r in rubrics] == [
        ("a", "task", "T", "Check this."),
        ("b", "task", "T", "Check this."),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "kind: core\nrubrics:\n" + GOOD_ENTRY.format(name="a") + "  - name: b\n    title: T\n",
            "rubrics[1].text: field required",
        ),
        ("kind: core\nrubrics:\n" + GOOD_ENTRY.format(name="a") * 2, "rubrics[1].name: duplicate name 'a'"),
        ("kind: core\nrubrics:\n  - name: [unclosed\n", "not valid YAML (line 4)"),
        ("kind: core\nrubrics: [\n", "not valid YAML"),
        (
            "kind: style\nrubrics:\n" + GOOD_ENTRY.format(name="a"),
            "kind: must be one of core, prescriptive, task, got 'style'",
        ),
        ("rubrics:\n" + GOOD_ENTRY.format(name="a"), "kind: field required"),
        ("kind: core\n", "rubrics: field required"),
        ("kind: core\nrubrics: []\n", "rubrics: must be a non-empty list"),
        ("kind: core\nrubrics: hello\n", "rubrics: must be a non-empty list"),
        ("- just\n- a list\n", "top level must be a mapping"),
        ("", "top level must be a mapping"),
        ("kind: core\nextra: 1\nrubrics:\n" + GOOD_ENTRY.format(name="a"), "extra: unknown field"),
        ("kind: core\nrubrics:\n  - just a string\n", "rubrics[0]: expected a mapping"),
        (
            "kind: core\nrubrics:\n  - name: bad name\n    title: T\n    text: X\n",
            "rubrics[0].name: 'bad name' is not an identifier",
        ),
        (
            "kind: core\nrubrics:\n  - name: a\n    title: T\n    text: X\n    weight: 2\n",
            "rubrics[0].weight: unknown field",
        ),
        (
            "kind: core\nrubrics:\n  - name: a\n    title: T\n    text: ''\n",
            "rubrics[0].text: string should have at least 1 character",
        ),
        (
            "kind: core\nrubrics:\n  - name: a\n    title: [1]\n    text: X\n",
            "rubrics[0].title: input should be a valid string",
        ),
        (
            "kind: core\nrubrics:\n  - name: a\n    kind: task\n    title: T\n    text: X\n",
            "rubrics[0].kind: set kind once",
        ),
    ],
)
def test_bad_file_fails_on_one_line(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(RubricFileError) as info:
        load_rubric_file(path)
    error = str(info.value)
    assert "\n" not in error
    assert error.startswith(f"{path}: ")
    assert message in error


def test_missing_file_names_it(tmp_path):
    with pytest.raises(RubricFileError, match="nope.yaml: cannot read"):
        load_rubric_file(tmp_path / "nope.yaml")


def test_rubric_file_error_is_a_value_error():
    assert issubclass(RubricFileError, ValueError)


def _task(rubrics) -> Task:
    return Task(
        id="t7",
        env="chat",
        task_type="chat",
        messages=[{"role": "user", "content": "hi"}],
        metadata={"rubrics": rubrics},
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            ["Mentions the deadline.", "Under 100 words."],
            [("task_1", "Task rubric 1", "Mentions the deadline."), ("task_2", "Task rubric 2", "Under 100 words.")],
        ),
        (
            [{"name": "cites", "title": "Cites sources", "text": "Names a source."}],
            [("cites", "Cites sources", "Names a source.")],
        ),
        (
            ["  padded  ", {"text": "Only text."}],
            [("task_1", "Task rubric 1", "padded"), ("task_2", "Task rubric 2", "Only text.")],
        ),
        ([], []),
    ],
)
def test_task_rubrics_from_task(raw, expected):
    rubrics = task_rubrics(_task(raw))
    assert [(r.name, r.title, r.text) for r in rubrics] == expected
    assert all(r.kind == "task" for r in rubrics)


@pytest.mark.parametrize(
    "row",
    [
        {"id": "r1", "rubrics": ["Be brief."]},
        {"id": "r1", "metadata": {"rubrics": ["Be brief."]}},
    ],
)
def test_task_rubrics_from_dataset_row(row):
    assert [r.text for r in task_rubrics(row)] == ["Be brief."]


@pytest.mark.parametrize(
    "task", [_task(None), {"id": "x"}, {"id": "x", "metadata": None}, Task(id="t", env="e", task_type="t", messages=[])]
)
def test_no_task_rubrics(task):
    assert task_rubrics(task) == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (["ok", 3], "task 't7': rubrics[1]: expected a string or a name/title/text mapping, got int"),
        (["ok", ""], "task 't7': rubrics[1]: empty rubric text"),
        ([{"title": "x"}], "task 't7': rubrics[0].text: field required"),
        ([{"name": "a b", "text": "x"}], "task 't7': rubrics[0].name: 'a b' is not an identifier"),
        ([{"name": "a", "text": "x"}, {"name": "a", "text": "y"}], "task 't7': rubrics[1].name: duplicate name 'a'"),
        ("Be brief.", "task 't7': rubrics: must be a list"),
    ],
)
def test_malformed_task_rubrics_name_task_and_index(raw, message):
    with pytest.raises(RubricFileError) as info:
        task_rubrics(_task(raw))
    assert str(info.value) == message or str(info.value).startswith(message)


def test_rubric_model_is_strict():
    with pytest.raises(ValidationError):
        Rubric(name="a", kind="style", title="T", text="x")
    with pytest.raises(ValidationError):
        Rubric(name="1a", kind="core", title="T", text="x")
    rubric = Rubric(name="a", kind="core", title="T", text="x")
    with pytest.raises(ValidationError):
        rubric.name = "b"
