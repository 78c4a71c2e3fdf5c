"""The rephrase run: documents -> chunks -> style-conditioned rewrites, chunk by chunk -> fidelity check per chunk ->
HF dataset of the rewrites with provenance (K2's knowledge rephrasing).

    k2post rephrase configs/rephrase_demo.yaml out_dir=runs/rephrase      # the command (pipelines/rephrase.py)
    stats = run_rephrase(cfg)                                             # in process; rewriter= / judge= injectable

Each document (a JSONL row / HF dataset row, or an entity of the synthetic corpus) is cut into chunks of at most
`chunk_tokens` tokens at sentence ends. Rewrite k (1..rewrites_per_document) uses style `styles[(k-1) % len]`;
each chunk is rewritten after the rewritten chunks before it, then judged (`fidelity_judge`); an unfaithful chunk is
rewritten again up to `max_retries` times, and a chunk that never passes drops that rewrite of the document
(recorded in dropped.jsonl). The kept pieces are joined with spaces.

Writes into `out_dir`:
- `shards/shard-NNNNN.jsonl` — the rows of `shard_size` documents, written at once (tmp + rename) after
  `shard-NNNNN.meta.json` (the shard's document ids, counts and dropped rewrites); a rerun of the same config
  skips the shards already written;
- `dataset/` — HF dataset (columns id, text, source_id, chunk_ids, style, rewrite_index, fidelity, retries,
  domain), written atomically; `dropped.jsonl` — every dropped rewrite (document, rewrite, chunk, reason);
- `stats.json` — documents, rewrites kept / dropped, chunks, chunk retries, tokens in / out, seconds;
  `config.yaml` — the resolved config (`k2post rephrase --resume OUT_DIR` continues from it).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from k2post.config.loader import dump_yaml
from k2post.rephrase.chunking import chunk_document
from k2post.rephrase.config import RephraseConfig, RephraseInputConfig
from k2post.rephrase.corpus import build_corpus, render_document
from k2post.rephrase.fidelity import ChecksJudge, ChunkJudge, LLMChunkJudge, ModelChunkJudge
from k2post.rephrase.rewriters import BuiltinRewriter, LLMRewriter, RephraseError, Rewriter, UnrewritableText, shorten

__all__ = ["Document", "RephraseError", "load_documents", "run_rephrase"]

STAT_KEYS = ("documents", "originals", "rewrites_kept", "rewrites_dropped", "chunks", "chunk_retries")
STAT_KEYS += ("tokens_in", "tokens_out")
# settings a resumed run may change (a shard of other documents, after a new limit or shard_size, is redone)
CALL_FAILURES = ("rewrite failed:", "judge call failed:")  # drop reasons of a failed endpoint call
RESUME_IGNORED = frozenset({"resume", "limit", "shard_size", "llm", "out_dir"})


@dataclass(frozen=True)
class Document:
    """A source document: its id (provenance of every rewrite) and text."""

    id: str
    text: str


# ----------------------------------------------------------------------------- documents


def load_documents(cfg: RephraseConfig) -> tuple[list[Document], int]:
    """(the first `limit` documents, how many empty-text rows were skipped); RephraseError on a bad row."""
    if cfg.input.path is None:
        entities = build_corpus(cfg.input.synthetic_entities, cfg.seed)
        docs = [Document(e.name, render_document(e, 0)) for e in entities]
        return docs[: cfg.limit], 0
    return read_documents(cfg.input, cfg.limit)


def read_documents(inp: RephraseInputConfig, limit: int | None) -> tuple[list[Document], int]:
    """Documents of a JSONL file or HF dataset dir, in order; ids checked unique; empty texts skipped."""
    path = Path(str(inp.path))
    if not path.exists():
        raise RephraseError(f"input.path {path}: no such file or directory")
    docs: list[Document] = []
    seen: dict[str, int] = {}
    skipped = 0
    for number, row in dataset_rows(path) if path.is_dir() else jsonl_rows(path):
        doc = document_from_row(row, number, path, inp)
        if doc.id in seen:
            raise RephraseError(
                f"input row {number} of {path}: id {doc.id!r} repeats row {seen[doc.id]}'s "
                "(ids must be unique: fix the data, or set input.id_field: null to number the rows)"
            )
        seen[doc.id] = number
        if not doc.text.strip():
            skipped += 1
            continue
        docs.append(doc)
        if limit is not None and len(docs) >= limit:
            break
    if not docs:
        raise RephraseError(f"input.path {path}: no documents with text")
    return docs, skipped


def jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) of every non-blank line."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as err:
                raise RephraseError(f"input row {number} of {path}: not valid JSON ({err.msg})") from None


def dataset_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(index, row) of an HF dataset saved with `save_to_disk`."""
    from datasets import Dataset, load_from_disk

    try:
        dataset = load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as err:
        raise RephraseError(f"input.path {path}: not an HF dataset saved with save_to_disk ({err})") from None
    if not isinstance(dataset, Dataset):
        raise RephraseError(
            f"input.path {path}: a dataset with splits {sorted(dataset)}: point input.path at one split's directory"
        )
    yield from enumerate(dataset)


def document_from_row(row: Any, number: int, path: Path, inp: RephraseInputConfig) -> Document:
    """The row's Document; RephraseError naming the row and the config key on a missing or mistyped field."""
    where = f"input row {number} of {path}"
    if not isinstance(row, dict):
        raise RephraseError(f"{where}: not a JSON object but {type(row).__name__}")
    if inp.text_field not in row:
        raise RephraseError(f"{where}: no {inp.text_field!r} field (input.text_field)")
    text = row[inp.text_field]
    if not isinstance(text, str):
        raise RephraseError(f"{where}: {inp.text_field!r} is {type(text).__name__}, not a string (input.text_field)")
    if inp.id_field is None:
        return Document(f"row-{number}", text)
    if inp.id_field not in row:
        raise RephraseError(f"{where}: no {inp.id_field!r} field (input.id_field; null numbers the rows)")
    doc_id = row[inp.id_field]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise RephraseError(f"{where}: {inp.id_field!r} is {type(doc_id).__name__}, not a string or integer")
    return Document(str(doc_id), text)


# ----------------------------------------------------------------------------- rewriting


@dataclass
class RephraseJob:
    """What rewriting needs: the rewriter and judge, the token counter, and the settings of the rows."""

    rewriter: Rewriter
    judge: ChunkJudge
    count_tokens: Callable[[str], int]
    cfg: RephraseConfig
    close: Callable[[], None] = field(default=lambda: None)


@dataclass
class ChunkOutcome:
    """The first faithful rewrite of a chunk (None when no attempt passed), its score, failed attempts, reason."""

    text: str | None
    score: float
    failures: int
    reason: str
    last: str = ""


@dataclass
class RewriteOutcome:
    """One rewrite of a document: its row, or the dropped record; chunks processed and failed attempts."""

    row: dict[str, Any] | None
    dropped: dict[str, Any] | None
    chunks: int
    failures: int


def rewrite_chunk(chunk: str, previous: list[str], style: str, k: int, salt: str, job: RephraseJob) -> ChunkOutcome:
    """Up to 1 + max_retries attempts (rewrite, judge); the first faithful one is kept. A rewriter exception (a
    client error) is a failed attempt; `RephraseError` (text the backend cannot rewrite) propagates."""
    failures, reason, last = 0, "", ""
    for _ in range(1 + job.cfg.max_retries):
        try:
            text = job.rewriter.rewrite(chunk, list(previous), style, k, salt)
        except RephraseError:
            raise
        except Exception as err:  # noqa: BLE001 (a failed call is a failed attempt, recorded with its message)
            failures, reason = failures + 1, f"rewrite failed: {type(err).__name__}: {shorten(str(err), 200)}"
            continue
        verdict = job.judge.judge(chunk, text)
        if verdict.faithful:
            return ChunkOutcome(text, verdict.score, failures, verdict.reason)
        failures, reason, last = failures + 1, verdict.reason, text
    return ChunkOutcome(None, 0.0, failures, reason, last)


def chunk_salt(doc_id: str, chunk: int) -> str:
    """What tells a chunk's rewrites apart from other chunks' (chunk 0: the document id, as `render_rewrite`)."""
    return doc_id if chunk == 0 else f"{doc_id}#{chunk}"


def rewrite_document(doc: Document, chunks: list[str], k: int, job: RephraseJob) -> RewriteOutcome:
    """Rewrite k of `doc`: chunk after chunk, each conditioned on the pieces before it; dropped at the first chunk
    that never passes the judge."""
    style = job.cfg.styles[(k - 1) % len(job.cfg.styles)]
    pieces: list[str] = []
    scores: list[float] = []
    failures = 0
    for i, chunk in enumerate(chunks):
        try:
            outcome = rewrite_chunk(chunk, pieces, style, k, chunk_salt(doc.id, i), job)
        except UnrewritableText as err:
            raise err.located(doc.id, i) from None
        failures += outcome.failures
        if outcome.text is None:
            dropped = {"source_id": doc.id, "rewrite_index": k, "style": style, "chunk": i}
            dropped |= {"attempts": outcome.failures, "reason": outcome.reason, "last_rewrite": outcome.last}
            return RewriteOutcome(None, dropped, i + 1, failures)
        pieces.append(outcome.text)
        scores.append(outcome.score)
    row = make_row(doc, k, " ".join(pieces), list(range(len(chunks))), style, job.cfg.domain)
    row.update(fidelity=round(sum(scores) / len(scores), 4) if scores else 1.0, retries=failures)
    return RewriteOutcome(row, None, len(chunks), failures)


def make_row(doc: Document, k: int, text: str, chunk_ids: list[int], style: str, domain: str) -> dict[str, Any]:
    """A dataset row (columns in order) with fidelity 1.0 and no retries; callers set those of a rewrite."""
    return {
        "id": f"{doc.id}#r{k}",
        "text": text,
        "source_id": doc.id,
        "chunk_ids": chunk_ids,
        "style": style,
        "rewrite_index": k,
        "fidelity": 1.0,
        "retries": 0,
        "domain": domain,
    }


def original_row(doc: Document, n_chunks: int, domain: str) -> dict[str, Any]:
    """The source document as a row of its own (rewrite_index 0, style 'original')."""
    return make_row(doc, 0, doc.text, list(range(n_chunks)), "original", domain)


# ----------------------------------------------------------------------------- shards


@dataclass
class Shard:
    """The rows, dropped rewrites and counts of one shard of documents."""

    index: int
    doc_ids: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)
    resumed: bool = False


def rephrase_shard(index: int, docs: list[Document], job: RephraseJob, advance: Callable[[Shard], None]) -> Shard:
    """Every rewrite of every document of the shard; `advance(shard)` after each document."""
    shard, cfg = Shard(index, [d.id for d in docs]), job.cfg
    for doc in docs:
        chunks = chunk_document(doc.text, job.count_tokens, cfg.chunk_tokens)
        shard.stats.update(documents=1, tokens_in=job.count_tokens(doc.text))
        if cfg.include_original:
            shard.rows.append(original_row(doc, len(chunks), cfg.domain))
            shard.stats["originals"] += 1
        for k in range(1, cfg.rewrites_per_document + 1):
            outcome = rewrite_document(doc, chunks, k, job)
            shard.stats.update(chunks=outcome.chunks, chunk_retries=outcome.failures)
            if outcome.row is not None:
                shard.rows.append(outcome.row)
                shard.stats.update(rewrites_kept=1, tokens_out=job.count_tokens(outcome.row["text"]))
            else:
                shard.dropped.append(outcome.dropped)
                shard.stats["rewrites_dropped"] += 1
        advance(shard)
    return shard


def shard_paths(out: Path, index: int) -> tuple[Path, Path]:
    """(rows file, meta file) of shard `index`."""
    return out / "shards" / f"shard-{index:05d}.jsonl", out / "shards" / f"shard-{index:05d}.meta.json"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temp file next to `path`, fsync it, rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


def jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_shard(out: Path, shard: Shard) -> None:
    """The meta file first, the rows file last: a shard is done when its rows file exists."""
    rows_path, meta_path = shard_paths(out, shard.index)
    meta = {"documents": shard.doc_ids, "stats": dict(shard.stats), "dropped": shard.dropped}
    write_atomic(meta_path, json.dumps(meta, ensure_ascii=False) + "\n")
    write_atomic(rows_path, jsonl(shard.rows))


def read_shard(out: Path, index: int, doc_ids: list[str]) -> Shard | None:
    """Shard `index` as written by an earlier run, or None when it is missing or holds other documents."""
    rows_path, meta_path = shard_paths(out, index)
    if not rows_path.is_file() or not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("documents") != doc_ids:
        return None
    rows = [json.loads(line) for line in rows_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return Shard(index, doc_ids, rows, meta["dropped"], Counter(meta["stats"]), resumed=True)


# ----------------------------------------------------------------------------- the run


def make_counter(tokenizer: str | None) -> Callable[[str], int]:
    """Token count of a text: the tokenizer's (no special tokens), or whitespace-separated words."""
    if tokenizer is None:
        return lambda text: len(text.split())
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError) as err:
        raise RephraseError(f"tokenizer {tokenizer}: cannot load it ({shorten(str(err), 200)})") from None
    return lambda text: len(tok.encode(text, add_special_tokens=False))


def make_judge(cfg: RephraseConfig, client: Any) -> ChunkJudge:
    """The configured `fidelity_judge` (the trained judge's module is imported only for `model`)."""
    if cfg.fidelity_judge == "llm":
        return LLMChunkJudge(client, max_tokens=cfg.llm_sampling.judge_max_tokens)
    if cfg.fidelity_judge == "checks":
        return ChecksJudge()
    from k2post.judging.faithfulness_model import load_trained_judge

    try:
        return ModelChunkJudge(load_trained_judge(cfg.judge_model))
    except (OSError, ValueError) as err:
        raise RephraseError(f"judge_model: {(str(err).splitlines() or [''])[0]}") from None


def preflight(client: Any, base_url: str) -> None:
    """One tiny chat call before the run: an endpoint that is down, refuses the key or serves no such model is one
    RephraseError line (exit 2) now, not a retried failure on every document and "0 kept" at the end."""
    from k2post.llm.http_client import endpoint_problem

    problem = endpoint_problem(client, base_url)
    if problem is not None:
        raise RephraseError(problem)


def call_failures_only(shards: list[Shard]) -> str | None:
    """The last reason when nothing was kept and every dropped rewrite was a failed endpoint call (the endpoint died
    during the run), else None."""
    dropped = [record for shard in shards for record in shard.dropped]
    if not dropped or any(row["rewrite_index"] for shard in shards for row in shard.rows):
        return None
    failed = [d["reason"] for d in dropped if d["reason"].startswith(CALL_FAILURES)]
    return failed[-1] if len(failed) == len(dropped) else None


def make_job(cfg: RephraseConfig, rewriter: Rewriter | None, judge: ChunkJudge | None) -> RephraseJob:
    """Rewriter and judge from the config where not given (one HTTP client for both, closed by `job.close`)."""
    needs_client = (rewriter is None and cfg.backend == "llm") or (judge is None and cfg.fidelity_judge == "llm")
    client = None
    if needs_client:
        from k2post.llm.http_client import HTTPLLMClient

        client = HTTPLLMClient(cfg.llm)
        try:
            preflight(client, cfg.llm.base_url)
        except BaseException:
            client.close()
            raise
    close = client.close if client is not None else (lambda: None)
    if rewriter is None:
        sampling = cfg.llm_sampling
        rewriter = (
            LLMRewriter(client, sampling.temperature, sampling.max_tokens, cfg.context_chars)
            if cfg.backend == "llm"
            else BuiltinRewriter()
        )
    try:
        judge = judge if judge is not None else make_judge(cfg, client)
        return RephraseJob(rewriter, judge, make_counter(cfg.tokenizer), cfg, close)
    except BaseException:
        close()
        raise


def prepare_out_dir(out: Path, cfg: RephraseConfig) -> None:
    """Start over (resume: false) or check that the shards there are of this config; write config.yaml."""
    if not cfg.resume:
        shutil.rmtree(out / "shards", ignore_errors=True)
    elif (out / "config.yaml").is_file() and any((out / "shards").glob("shard-*.jsonl")):
        old = yaml.safe_load((out / "config.yaml").read_text()) or {}
        new = cfg.model_dump(mode="json")
        changed = sorted(k for k in new if k not in RESUME_IGNORED and old.get(k) != new[k])
        if changed:
            raise RephraseError(
                f"{out} holds shards of a run with other settings ({', '.join(changed)} differ): use another "
                "out_dir, or set `resume: false` in the config to start over"
            )
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "config.yaml", dump_yaml(cfg))


def progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]rephrase"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("kept {task.fields[kept]} dropped {task.fields[dropped]}"),
        TimeElapsedColumn(),
        console=console,
    )


def rephrase_all(docs: list[Document], job: RephraseJob, out: Path, console: Console) -> list[Shard]:
    """Every shard: read back when an earlier run wrote it (same documents), else rephrased and written."""
    size = job.cfg.shard_size
    batches = [docs[start : start + size] for start in range(0, len(docs), size)]
    shards = [read_shard(out, i, [d.id for d in batch]) for i, batch in enumerate(batches)]
    done = Counter()
    for shard in shards:
        done.update(shard.stats if shard is not None else {})
    if done:
        console.print(f"resuming: {sum(s is not None for s in shards)} of {len(batches)} shards already written")
    with progress_bar(console) as progress:
        bar = progress.add_task("rephrase", total=len(docs), completed=done["documents"], kept=0, dropped=0)

        def advance(shard: Shard) -> None:
            kept = done["rewrites_kept"] + shard.stats["rewrites_kept"]
            progress.update(
                bar, advance=1, kept=kept, dropped=done["rewrites_dropped"] + shard.stats["rewrites_dropped"]
            )

        progress.update(bar, kept=done["rewrites_kept"], dropped=done["rewrites_dropped"])
        for i, batch in enumerate(batches):
            if shards[i] is None:
                shards[i] = rephrase_shard(i, batch, job, advance)
                write_shard(out, shards[i])
                done.update(shards[i].stats)
    return shards


def write_dataset(rows: list[dict[str, Any]], target: Path) -> None:
    """The rows as an HF dataset at `target` (typed columns, also when empty), written to a temp dir then renamed."""
    from datasets import Dataset, Features, Sequence, Value
    from datasets.utils import logging as datasets_logging

    text, integer = Value("string"), Value("int64")
    features = Features(
        {"id": text, "text": text, "source_id": text, "chunk_ids": Sequence(integer), "style": text}
        | {"rewrite_index": integer, "fidelity": Value("float64"), "retries": integer, "domain": text}
    )
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    bars = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()  # our own progress bar is enough
    try:
        columns = {name: [row[name] for row in rows] for name in features}
        Dataset.from_dict(columns, features=features).save_to_disk(str(tmp), num_shards=1 if not rows else None)
    finally:
        if bars:
            datasets_logging.enable_progress_bar()
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def run_stats(shards: list[Shard], skipped: int, seconds: float) -> dict[str, Any]:
    """The run's counts (STAT_KEYS summed over the shards), shards resumed, and this run's wall time."""
    total = Counter()
    for shard in shards:
        total.update(shard.stats)
    stats: dict[str, Any] = {key: int(total[key]) for key in STAT_KEYS}
    stats["documents_skipped_empty"] = skipped
    stats["shards"], stats["shards_resumed"] = len(shards), sum(s.resumed for s in shards)
    stats["seconds"] = round(seconds, 3)
    return stats


def run_rephrase(
    cfg: RephraseConfig,
    console: Console | None = None,
    rewriter: Rewriter | None = None,
    judge: ChunkJudge | None = None,
) -> dict[str, Any]:
    """Run (or resume) a rephrase; returns the stats also written to out_dir/stats.json. `rewriter` / `judge`
    replace the configured ones (tests, an in-process `EngineLLMClient`)."""
    console = console or Console(stderr=True)
    start, out = time.monotonic(), Path(cfg.out_dir)
    docs, skipped = load_documents(cfg)
    job = make_job(cfg, rewriter, judge)
    prepare_out_dir(out, cfg)
    try:
        shards = rephrase_all(docs, job, out, console)
    finally:
        job.close()
    failure = call_failures_only(shards)
    if failure is not None:
        raise RephraseError(
            f"no rewrite kept: every one of {sum(len(s.dropped) for s in shards)} rewrites failed on an endpoint call "
            f"(last: {shorten(failure, 200)}); the shards written so far stay in {out} for --resume"
        )
    write_dataset([row for s in shards for row in s.rows], out / "dataset")
    write_atomic(out / "dropped.jsonl", jsonl([record for s in shards for record in s.dropped]))
    stats = run_stats(shards, skipped, time.monotonic() - start)
    write_atomic(out / "stats.json", json.dumps(stats, indent=2) + "\n")
    console.print(
        f"rephrase: {stats['rewrites_kept']} kept, {stats['rewrites_dropped']} dropped of {stats['documents']} "
        f"documents x {cfg.rewrites_per_document}; {stats['chunks']} chunks, {stats['chunk_retries']} retries; "
        f"{stats['tokens_in']} -> {stats['tokens_out']} tokens; {stats['seconds']:.1f}s"
    )
    return stats
