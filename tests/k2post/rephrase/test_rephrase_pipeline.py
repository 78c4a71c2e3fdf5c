"""The rephrase run (k2post/rephrase/pipeline.py, pipelines/rephrase.py): builtin end to end on the synthetic corpus,
resume, the LLM path over a scripted client (retries, drops, client errors, the rewritten context in the prompt), input
errors as one line, and `k2post rephrase` as a command.
Run: python -m pytest tests/k2post/rephrase/test_rephrase_pipeline.py -q
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict, load_from_disk
from rich.console import Console

from k2post.config.loader import ConfigError, validate_config
from k2post.llm.client import LLMClientError
from k2post.rephrase.chunking import split_sentences
from k2post.rephrase.config import RephraseConfig
from k2post.rephrase.corpus import build_corpus, parse_fact, render_document, render_rewrite
from k2post.rephrase.fidelity import ChecksJudge
from k2post.rephrase.pipeline import (
    Document,
    RephraseError,
    RephraseJob,
    chunk_document,
    rewrite_document,
    run_rephrase,
)
from k2post.rephrase.rewriters import BuiltinRewriter, LLMRewriter

REPO = Path(__file__).resolve().parents[3]
QUIET = Console(file=io.StringIO())
COLUMNS = ["id", "text", "source_id", "chunk_ids", "style", "rewrite_index", "fidelity", "retries", "domain"]


def config(tmp_path: Path, **fields) -> RephraseConfig:
    return validate_config(RephraseConfig, {"out_dir": str(tmp_path / "out"), **fields}, "test")


def shard_rows(out: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(out.glob("shards/shard-*.jsonl")) for line in path.open()]


# ----------------------------------------------------------------------------- builtin backend, synthetic corpus


def test_builtin_rewrites_keep_every_fact_with_provenance(tmp_path):
    cfg = config(tmp_path, input={"synthetic_entities": 12}, rewrites_per_document=3, chunk_tokens=16)
    cfg.include_original, cfg.shard_size = True, 5
    stats = run_rephrase(cfg, QUIET)
    entities = {e.name: e for e in build_corpus(12, seed=0)}
    assert stats["documents"] == stats["originals"] == 12 and stats["rewrites_kept"] == 36
    assert stats["rewrites_dropped"] == stats["chunk_retries"] == 0 and stats["shards"] == 3
    assert stats["chunks"] > 36 and stats["tokens_out"] > stats["tokens_in"] > 0  # some documents make 2 chunks
    dataset = load_from_disk(str(tmp_path / "out" / "dataset"))
    assert dataset.column_names == COLUMNS and len(dataset) == 48
    by_source = defaultdict(dict)
    for row in dataset:
        entity = entities[row["source_id"]]
        by_source[entity.name][row["rewrite_index"]] = row["text"]
        assert row["id"] == f"{entity.name}#r{row['rewrite_index']}" and row["domain"] == "rephrase"
        assert {parse_fact(s) for s in split_sentences(row["text"])} == set(entity.facts)
        n_chunks = len(chunk_document(render_document(entity, 0), lambda s: len(s.split()), 16))
        assert row["chunk_ids"] == list(range(n_chunks)) and row["fidelity"] == 1.0 and row["retries"] == 0
        if row["rewrite_index"] == 0:
            assert row["style"] == "original" and row["text"] == render_document(entity, 0)
        else:
            assert row["style"] == cfg.styles[row["rewrite_index"] - 1]
            if n_chunks == 1:  # one chunk: exactly the corpus's own rewrite k
                assert row["text"] == render_rewrite(entity, row["rewrite_index"])
    assert all(sorted(texts) == [0, 1, 2, 3] for texts in by_source.values())
    assert all(len(set(texts.values())) == 4 for texts in by_source.values())  # 3 distinct rewrites + the original
    assert (tmp_path / "out" / "dropped.jsonl").read_text() == ""
    assert json.loads((tmp_path / "out" / "stats.json").read_text()) == stats


class CountingRewriter:
    """The builtin rewriter, counting its calls."""

    def __init__(self):
        self.calls, self.inner = 0, BuiltinRewriter()

    def rewrite(self, *args):
        self.calls += 1
        return self.inner.rewrite(*args)


def test_a_rerun_reuses_the_written_shards(tmp_path):
    cfg = config(tmp_path, input={"synthetic_entities": 9}, rewrites_per_document=2, shard_size=4)
    first, counting = run_rephrase(cfg, QUIET, rewriter=CountingRewriter()), CountingRewriter()
    again = run_rephrase(cfg, QUIET, rewriter=counting)
    assert counting.calls == 0 and again["shards_resumed"] == again["shards"] == 3
    same = lambda stats: {k: v for k, v in stats.items() if k not in ("seconds", "shards_resumed")}  # noqa: E731
    assert same(again) == same(first)
    rows = shard_rows(tmp_path / "out")
    (tmp_path / "out" / "shards" / "shard-00001.jsonl").unlink()  # a run cut before shard 1 was written
    counting = CountingRewriter()
    assert run_rephrase(cfg, QUIET, rewriter=counting)["shards_resumed"] == 2 and 8 <= counting.calls <= 16
    assert shard_rows(tmp_path / "out") == rows and len(load_from_disk(str(tmp_path / "out" / "dataset"))) == 18
    with pytest.raises(RephraseError, match=r"other settings \(rewrites_per_document differ\).*resume: false"):
        run_rephrase(config(tmp_path, input={"synthetic_entities": 9}, rewrites_per_document=3), QUIET)
    resized = config(tmp_path, input={"synthetic_entities": 9}, rewrites_per_document=2, shard_size=3)
    assert run_rephrase(resized, QUIET)["shards_resumed"] == 0  # shards of other documents are redone
    assert shard_rows(tmp_path / "out") == rows
    counting = CountingRewriter()
    cfg.resume = False
    run_rephrase(cfg, QUIET, rewriter=counting)
    assert counting.calls > 16


def test_builtin_backend_refuses_text_it_cannot_parse(tmp_path):
    job = RephraseJob(BuiltinRewriter(), ChecksJudge(), lambda s: len(s.split()), config(tmp_path))
    doc = Document("doc-1", "Kalo was born in 1931. It rained that year.")
    with pytest.raises(RephraseError) as err:
        rewrite_document(doc, [doc.text], 1, job)
    assert str(err.value) == (
        "builtin backend rewrites only the synthetic corpus's sentences; doc doc-1 chunk 0: 'It rained that year.'"
    )


# ----------------------------------------------------------------------------- LLM path over a scripted client

DOCS = [
    {"id": "anna", "text": "Anna Berg was born in 1931 in the town of Lund. She moved to Oslo in 1950 to study."},
    {"id": "boris", "text": "Boris Lind founded Kappa Works in 1977."},
    {"id": "clara", "text": "Clara Holm wrote 12 books."},
]


def passage(messages) -> str:
    return messages[-1].content.split("<passage>\n")[1].split("\n</passage>")[0]


class ScriptedClient:
    """Anna: each passage first loses its year, then comes back faithful; Boris: always loses the year; Clara: the
    server fails. Records every prompt."""

    def __init__(self):
        self.prompts, self.seen = [], set()

    def chat(self, messages, **kw):
        self.prompts.append(messages[-1].content)
        text = passage(messages)
        if "Clara" in text:
            raise LLMClientError("POST /v1/chat/completions: status 503")
        if "Boris" in text or text not in self.seen:
            self.seen.add(text)
            return text.replace("1931", "that year").replace("1950", "later").replace("1977", "the seventies")
        return f"<think>keep the facts</think>Indeed, {text}"


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def llm_config(tmp_path: Path, path: Path, **fields) -> RephraseConfig:
    fields = {"backend": "llm", "llm": {"base_url": "http://127.0.0.1:9/v1"}, "chunk_tokens": 16, **fields}
    return config(tmp_path, input={"path": str(path)}, max_retries=1, **fields)


def test_llm_rewrites_are_retried_dropped_and_counted(tmp_path):
    cfg = llm_config(tmp_path, write_jsonl(tmp_path / "docs.jsonl", DOCS), styles=["As a museum guide."])
    client = ScriptedClient()
    stats = run_rephrase(cfg, QUIET, rewriter=LLMRewriter(client, 0.7, 64, cfg.context_chars))
    assert stats["documents"] == 3 and stats["rewrites_kept"] == 1 and stats["rewrites_dropped"] == 2
    assert stats["chunks"] == 4 and stats["chunk_retries"] == 2 + 2 + 2  # anna: 1 per chunk; boris, clara: both tries
    (row,) = load_from_disk(str(tmp_path / "out" / "dataset"))
    assert row["id"] == "anna#r1" and row["chunk_ids"] == [0, 1] and row["retries"] == 2 and row["fidelity"] == 1.0
    assert (
        row["text"]
        == "Indeed, Anna Berg was born in 1931 in the town of Lund. Indeed, She moved to Oslo in 1950 to study."
    )
    assert row["style"] == "As a museum guide." and row["domain"] == "rephrase"
    dropped = [json.loads(line) for line in (tmp_path / "out" / "dropped.jsonl").read_text().splitlines()]
    assert [(d["source_id"], d["rewrite_index"], d["chunk"], d["attempts"]) for d in dropped] == [
        ("boris", 1, 0, 2),
        ("clara", 1, 0, 2),
    ]
    assert dropped[0]["reason"] == "lost 1977" and dropped[0]["last_rewrite"].endswith("in the seventies.")
    assert dropped[1]["reason"] == "rewrite failed: LLMClientError: POST /v1/chat/completions: status 503"
    # the second chunk's prompts carry the first chunk's kept rewrite, not its failed attempt
    anna_second = [p for p in client.prompts if "She moved to Oslo" in p.split("Passage to rewrite:")[1]]
    assert len(anna_second) == 2 and all(
        "Indeed, Anna Berg was born in 1931 in the town of Lund." in p for p in anna_second
    )
    assert all("As a museum guide." in p for p in client.prompts)


@pytest.mark.parametrize("fields", [{"fidelity_judge": "llm"}, {"backend": "llm"}])
def test_an_unreachable_endpoint_is_refused_before_the_run(tmp_path, fields):
    """One preflight call before any document: a dead endpoint is one line (exit 2), not a retried failure on every
    document and "0 kept" with exit 0."""
    llm = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": 0, "timeout_s": 5}
    inp = (
        {"path": str(write_jsonl(tmp_path / "docs.jsonl", DOCS))} if "backend" in fields else {"synthetic_entities": 3}
    )
    cfg = config(tmp_path, input=inp, llm=llm, max_retries=0, **fields)
    with pytest.raises(RephraseError, match=r"^llm endpoint http://127.0.0.1:9/v1 does not answer \(.*connection"):
        run_rephrase(cfg, QUIET)
    assert not (tmp_path / "out").exists()


class DiesAfterPreflight:
    """An endpoint that answers the preflight, then fails every call (a server that died during the run)."""

    def __init__(self):
        self.calls = 0

    def chat(self, messages, **kw):
        self.calls += 1
        raise LLMClientError("POST /v1/chat/completions: connection failed (ConnectError) after 4 attempt(s)")


def test_a_run_whose_every_call_failed_is_an_error_not_zero_kept(tmp_path):
    cfg = llm_config(tmp_path, write_jsonl(tmp_path / "docs.jsonl", DOCS))
    client = DiesAfterPreflight()
    with pytest.raises(RephraseError, match=r"no rewrite kept: every one of 3 rewrites failed on an endpoint call"):
        run_rephrase(cfg, QUIET, rewriter=LLMRewriter(client))
    assert client.calls == 3 * 2 and not (tmp_path / "out" / "dataset").exists()  # 1 + max_retries per document
    assert len(shard_rows(tmp_path / "out")) == 0 and list((tmp_path / "out" / "shards").glob("*.jsonl"))


def test_hf_dataset_input_and_id_free_rows(tmp_path):
    Dataset.from_list([{"body": d["text"]} for d in DOCS[:2]]).save_to_disk(str(tmp_path / "docs"))

    class Faithful:
        def chat(self, messages, **kw):
            return passage(messages)

    cfg = llm_config(tmp_path, tmp_path / "docs", rewrites_per_document=2, limit=1, include_original=True)
    cfg.input.text_field, cfg.input.id_field = "body", None
    stats = run_rephrase(cfg, QUIET, rewriter=LLMRewriter(Faithful()))
    assert stats["documents"] == 1 and stats["rewrites_kept"] == 2
    rows = load_from_disk(str(tmp_path / "out" / "dataset"))
    assert rows["id"] == ["row-0#r0", "row-0#r1", "row-0#r2"] and rows["style"][0] == "original"
    assert rows["style"][1:] == cfg.styles[:2]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([DOCS[0], {"id": "x", "body": "no text"}], "input row 2 of {path}: no 'text' field (input.text_field)"),
        ([{"id": "x", "text": 7}], "input row 1 of {path}: 'text' is int, not a string (input.text_field)"),
        ([{"text": "A."}], "input row 1 of {path}: no 'id' field (input.id_field; null numbers the rows)"),
        ([DOCS[0], "", DOCS[0]], "input row 3 of {path}: id 'anna' repeats row 1's"),
        ([DOCS[0], "{oops"], "input row 2 of {path}: not valid JSON"),
        (["[1, 2]"], "input row 1 of {path}: not a JSON object but list"),
        ([{"id": "e", "text": "  "}], "input.path {path}: no documents with text"),
    ],
)
def test_bad_input_rows_are_one_line_errors(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "docs.jsonl", rows)
    with pytest.raises(RephraseError) as err:
        run_rephrase(llm_config(tmp_path, path), QUIET, rewriter=LLMRewriter(ScriptedClient()))
    assert str(err.value).startswith(message.format(path=path)) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()  # nothing written before the input is read


def test_input_path_problems(tmp_path):
    DatasetDict({"train": Dataset.from_list(DOCS)}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(RephraseError, match=r"a dataset with splits \['train'\]: point input.path at one split"):
        run_rephrase(llm_config(tmp_path, tmp_path / "dd"), QUIET)
    with pytest.raises(RephraseError, match="nope.jsonl: no such file or directory"):
        run_rephrase(llm_config(tmp_path, tmp_path / "nope.jsonl"), QUIET)


def test_a_missing_trained_judge_is_one_line(tmp_path):
    cfg = config(tmp_path, fidelity_judge="model", judge_model=str(tmp_path / "judge"))
    with pytest.raises(RephraseError, match=r"^judge_model: .*judge: not a trained faithfulness judge"):
        run_rephrase(cfg, QUIET)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"fidelity_judge": "llm"}, "fidelity_judge: llm needs an `llm:` section"),
        ({"fidelity_judge": "model"}, "fidelity_judge: model needs judge_model"),
        ({"judge_model": "runs/judge"}, "judge_model is used by fidelity_judge: model only"),
        ({"shard_size": 0}, "shard_size"),
        ({"fidelity_judge": "vibes"}, "fidelity_judge"),
    ],
)
def test_bad_judge_configs_are_one_line(raw, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate_config(RephraseConfig, raw, "t")
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the command


def k2post(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k2post.cli", "rephrase", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_command_runs_the_demo_config_and_resumes(tmp_path):
    out = tmp_path / "demo"
    done = k2post("configs/rephrase_demo.yaml", f"out_dir={out}", "input.synthetic_entities=6")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"rephrase: 18 rewrites of 6 documents kept, 0 dropped -> {out}/dataset\n"
    assert len(load_from_disk(str(out / "dataset"))) == 24  # include_original: 6 originals + 18 rewrites
    again = k2post("--resume", str(out))
    assert again.returncode == 0 and "resuming: 1 of 1 shards already written" in again.stderr, again.stderr[-2000:]


def test_command_errors_are_one_line(tmp_path, capsys):
    done = k2post("configs/rephrase_demo.yaml", "backend=llm")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("k2post rephrase: error: ") and "backend: llm needs an `llm:` section" in done.stderr
    from k2post.cli import main

    path = write_jsonl(tmp_path / "docs.jsonl", [{"id": 1}])
    args = ["configs/rephrase_demo.yaml", "backend=llm", "llm.base_url=http://127.0.0.1:9/v1", f"input.path={path}"]
    assert main(["rephrase", *args, f"out_dir={tmp_path / 'out'}"]) == 2
    assert capsys.readouterr().err == (
        f"k2post rephrase: error: input row 1 of {path}: no 'text' field (input.text_field)\n"
    )
