"""Benchmark: K2's rephrase-vs-repeat ablation at tiny scale. The same knowledge, the same token budget, three ways:
the original documents for 10 epochs, one rephrasing for 10 epochs, ten rephrasings for one epoch each.

Run: `python benchmarks/rephrase_ablation.py [--seeds 0 1 2] [--entities 150] [--out runs/rephrase_ablation]
[--smoke]` (repo root). Per seed S:

1. knowledge: `k2post rephrase configs/rephrase_ablation.yaml seed=S` writes the synthetic corpus's documents
   (ENTITIES invented people, companies and cities, 3 facts each) with 10 builtin rephrasings each
   (`include_original`): different templates per fact and different fact orders, checked by the fidelity checks;
2. start: `k2post model init --flavor nano-qwen2 --seed S`, then `k2post sft` for one epoch on a background corpus
   (other entities, never in the knowledge or the questions: their names are filtered out) in 20 wordings, so the
   start knows the language of the documents but none of the facts (K2's ablation starts from a pretrained model);
3. the three arms, each `k2post sft` from that start on text rows (`data.path` = the arm's JSONL; MuonClip as in
   configs/sft_demo.yaml): `original_10ep` (rewrite 0, 10 epochs), `1rephrase_10ep` (rewrite 1, 10 epochs),
   `10rephrase_1ep` (rewrites 1..10, 1 epoch): 10 exposures of every fact in each arm (tokens trained: printed);
4. closed-book QA: every fact asked with a question template that shares no four-word run with any document template
   (tested in tests/k2post/rephrase/test_corpus.py), "Question: ...\\nAnswer:", scored as multiple choice: the
   gold value against 4 values of the same relation from other entities, by mean log-probability per answer token
   (chance = 0.2). Also the start's accuracy, and `cloze` (the original document's wording up to the value: a
   memorization probe, which favours the original arm by construction).

Also the QA accuracy of every arm split by how rewrite 1 (the `1rephrase_10ep` arm's text) words each fact: subject
before the value, or the value first ("The year 1931 saw the birth of Kalo"), which teaches a causal LM value ->
subject, not the subject -> value recall the questions ask for (the original wording always names the subject first).

Prints a table per seed and mean +- std, then one JSON line:
{"acc_original_10ep": .., "acc_1rephrase_10ep": .., "acc_10rephrase_1ep": .., "seeds": 3, "*_std": .., "start_acc": ..,
 "cloze": {..}, "tokens": {..}, "subject_first_share_1rephrase": .., "by_order": {..}, "entities": .., "minutes": ..}
(answers per fact are cached in each run's qa.json).
A finished step is reused (delete its folder to redo it). `--smoke`: 12 entities, one seed, 4-step arms from the
untrained model (checks that every step runs, not the figure).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._k2post_cli import run_cli  # noqa: E402

ARMS = {"original_10ep": ([0], 10), "1rephrase_10ep": ([1], 10), "10rephrase_1ep": (list(range(1, 11)), 1)}
N_CHOICES = 5
BACKGROUND_WORDINGS = 20
SFT = ["data.max_seq_len=256", "data.eval_fraction=0", "train.eval_every=0", "train.eval_at_start=false",
       "train.micro_batch_size=2", "train.progress_bar=false", "checkpoint.every=100000",
       "train.log_every=100"]  # fmt: skip


def rephrased(seed: int, out: Path, entities: int, rewrites: int, smoke: bool) -> list[dict[str, Any]]:
    """The knowledge corpus and its rephrasings (`k2post rephrase`), as rows."""
    from datasets import load_from_disk

    if not (out / "dataset").is_dir():
        args = [f"seed={seed}", f"out_dir={out}", f"input.synthetic_entities={entities}"]
        run_cli(["rephrase", "configs/rephrase_ablation.yaml", *args, f"rewrites_per_document={rewrites}"],
                out.with_suffix(".log"), in_process=smoke)  # fmt: skip
    return load_from_disk(str(out / "dataset")).to_list()


def write_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    path.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in rows))
    return path


def background_rows(seed: int, knowledge_names: set[str], count: int) -> list[dict[str, Any]]:
    """Documents of other entities in BACKGROUND_WORDINGS wordings; none mentions a knowledge entity's name."""
    from k2post.rephrase.corpus import build_corpus, render_rewrite

    others = [e for e in build_corpus(count, seed + 10_000) if e.name not in knowledge_names]
    others = [e for e in others if not any(f.value in knowledge_names for f in e.facts)]
    return [{"id": f"{e.name}#{k}", "text": render_rewrite(e, k)} for k in range(BACKGROUND_WORDINGS) for e in others]


def sft(start: Path, data: Path, run_dir: Path, epochs: int, seed: int, extra: list[str]) -> Path:
    """`k2post sft` from `start` on the text rows at `data` (reused when run_dir/final exists)."""
    if not (run_dir / "final").is_dir():
        args = [f"run_dir={run_dir}", f"model.path={start}", f"data.path={data}", f"train.epochs={epochs}"]
        run_cli(
            ["sft", "configs/sft_demo.yaml", *args, f"train.seed={seed}", *SFT, *extra], run_dir.with_suffix(".log")
        )
    return run_dir / "final"


def qa_results(model_dir: Path, entities: list[Any], seed: int) -> dict[str, list[bool]]:
    """Per fact: answered right as a question, and as a cloze (facts in entity order); cached in qa.json."""
    cache = model_dir.parent / "qa.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    from k2post.models.loading import load_causal_lm, load_tokenizer
    from k2post.rephrase.corpus import DOC_TEMPLATES, questions

    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir).eval()
    pool: dict[str, set[str]] = {}
    for entity in entities:
        for fact in entity.facts:
            pool.setdefault(fact.relation, set()).add(fact.value)
    rng, results = random.Random(seed), {"question": [], "cloze": []}
    for entity in entities:
        for fact, (question, answer) in zip(entity.facts, questions(entity)):
            others = sorted(pool[fact.relation] - {answer})
            choices = [answer, *rng.sample(others, min(N_CHOICES - 1, len(others)))]
            results["question"].append(best_choice(model, tokenizer, f"Question: {question}\nAnswer:", choices) == 0)
            template = DOC_TEMPLATES[fact.relation][0]  # every original template names the subject first
            prefix = template.split("{v}")[0].format(s=fact.subject).rstrip()
            results["cloze"].append(best_choice(model, tokenizer, prefix, choices) == 0)
    cache.write_text(json.dumps(results))
    return results


def best_choice(model: Any, tokenizer: Any, prompt: str, choices: list[str]) -> int:
    """Index of the choice with the highest mean log-probability per token after `prompt` (one padded batch)."""
    import torch

    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    answers = [tokenizer.encode(" " + choice, add_special_tokens=False) for choice in choices]
    width = len(prompt_ids) + max(map(len, answers))
    ids_BT = torch.zeros((len(choices), width), dtype=torch.long)
    for row, ids in enumerate(answers):
        ids_BT[row, : len(prompt_ids) + len(ids)] = torch.tensor(prompt_ids + ids)
    with torch.no_grad():
        logp_BTV = torch.log_softmax(model(ids_BT).logits, -1)  # right padding: the real tokens never see it
    scores = []
    for row, ids in enumerate(answers):
        positions = torch.arange(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(ids))
        scores.append(logp_BTV[row, positions, torch.tensor(ids)].mean().item())
    return max(range(len(choices)), key=scores.__getitem__)


def subject_first(rows: list[dict[str, Any]], entities: list[Any], rewrite_index: int) -> list[bool]:
    """Per fact (entity order): does rewrite `rewrite_index` state it with the subject before the value? (A causal
    LM learns subject -> value recall only from those: the value-first ones teach the reverse direction.)"""
    from k2post.rephrase.chunking import split_sentences
    from k2post.rephrase.corpus import parse_fact

    text = {r["source_id"]: r["text"] for r in rows if r["rewrite_index"] == rewrite_index}
    order = {}
    for entity in entities:
        for sentence in split_sentences(text[entity.name]):
            fact = parse_fact(sentence)
            order[fact] = sentence.index(fact.subject) < sentence.index(fact.value)
    return [order[fact] for entity in entities for fact in entity.facts]


def split_accuracy(correct: list[bool], mask: list[bool]) -> dict[str, float | None]:
    """Accuracy over the facts where `mask` is true / false."""
    first = [c for c, m in zip(correct, mask) if m]
    later = [c for c, m in zip(correct, mask) if not m]
    return {"subject_first": statistics.fmean(first) if first else None,
            "value_first": statistics.fmean(later) if later else None}  # fmt: skip


def run_seed(seed: int, out: Path, entities: int, smoke: bool) -> dict[str, Any]:
    """Steps 1-4 for one seed: accuracies and tokens per arm."""
    from k2post.rephrase.corpus import build_corpus

    out.mkdir(parents=True, exist_ok=True)
    rows = rephrased(seed, out / "rephrased", entities, max(ARMS["10rephrase_1ep"][0]), smoke)
    knowledge = build_corpus(entities, seed)  # what `k2post rephrase` rephrased (its synthetic input, same seed)
    names = {e.name for e in knowledge} | {f.value for e in knowledge for f in e.facts}
    base = out / "base"
    if not base.is_dir():
        run_cli(["model", "init", "--flavor", "nano-qwen2", "--out", str(base), "--seed", str(seed)],
                out / "model.log", in_process=smoke)  # fmt: skip
    extra = ["train.max_steps=4", "schedule.warmup_steps=1"] if smoke else []
    background = write_rows(background_rows(seed, names, 12 if smoke else 300), out / "background.jsonl")
    start = base if smoke else sft(base, background, out / "start", 1, seed, extra)  # smoke: one SFT fewer
    result: dict[str, Any] = {"start": accuracies(qa_results(start, knowledge, seed)), "tokens": {}, "by_order": {}}
    order = subject_first(rows, knowledge, 1)
    result["subject_first_share"] = statistics.fmean(order)
    for arm, (indices, epochs) in ARMS.items():
        chosen = write_rows([r for r in rows if r["rewrite_index"] in indices], out / f"{arm}.jsonl")
        final = sft(start, chosen, out / arm, epochs, seed, extra)
        answers = qa_results(final, knowledge, seed)
        result[arm] = accuracies(answers)
        result["by_order"][arm] = split_accuracy(answers["question"], order)
        trained = json.loads((out / arm / "summary.json").read_text())["data"]["train_tokens"] * epochs
        result["tokens"][arm] = trained if not smoke else None  # smoke runs stop after 4 steps
    return result


def accuracies(answers: dict[str, list[bool]]) -> tuple[float, float]:
    """(question accuracy, cloze accuracy)."""
    return statistics.fmean(answers["question"]), statistics.fmean(answers["cloze"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--entities", type=int, default=150, help="knowledge entities (3 facts each; default 150)")
    parser.add_argument("--out", default="runs/rephrase_ablation")
    parser.add_argument("--smoke", action="store_true", help="12 entities, one seed, 4 steps per training run")
    args = parser.parse_args()
    seeds, entities = (args.seeds[:1], 12) if args.smoke else (args.seeds, args.entities)
    started, results = time.monotonic(), []
    for seed in seeds:
        results.append(run_seed(seed, Path(args.out) / f"seed{seed}", entities, args.smoke))
        r = results[-1]
        line = "  ".join(f"{arm} {r[arm][0]:.3f} (cloze {r[arm][1]:.3f})" for arm in ARMS)
        print(f"seed {seed}: start {r['start'][0]:.3f}  {line}  tokens {r['tokens']}", flush=True)
    summary = summarize(results, seeds, entities, (time.monotonic() - started) / 60)
    print(f"\n{'arm':<16}{'QA acc':>8}{'+-':>7}{'cloze':>8}   ({len(seeds)} seeds, {entities} entities, chance 0.2)")
    for arm in ARMS:
        print(
            f"{arm:<16}{summary['acc_' + arm]:>8.3f}{summary['acc_' + arm + '_std']:>7.3f}{summary['cloze'][arm]:>8.3f}"
        )
    share = summary["subject_first_share_1rephrase"]
    print(f"\nQA acc by how rewrite 1 words each fact ({share:.0%} subject first, the rest value first):")
    for arm, split in summary["by_order"].items():
        print(f"{arm:<16}" + "  ".join(f"{key} {value:.3f}" for key, value in split.items() if value is not None))
    print(json.dumps(summary))
    return 0


def summarize(results: list[dict[str, Any]], seeds: list[int], entities: int, minutes: float) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for arm in ARMS:
        accs = [r[arm][0] for r in results]
        summary[f"acc_{arm}"] = round(statistics.fmean(accs), 4)
        summary[f"acc_{arm}_std"] = round(statistics.stdev(accs), 4) if len(accs) > 1 else 0.0
    summary["seeds"] = len(seeds)
    summary["start_acc"] = round(statistics.fmean(r["start"][0] for r in results), 4)
    summary["cloze"] = {arm: round(statistics.fmean(r[arm][1] for r in results), 4) for arm in ARMS}
    summary["tokens"] = {arm: [r["tokens"][arm] for r in results] for arm in ARMS}
    summary["subject_first_share_1rephrase"] = round(statistics.fmean(r["subject_first_share"] for r in results), 4)
    summary["by_order"] = {
        arm: {
            key: _mean_or_none([r["by_order"][arm][key] for r in results]) for key in ("subject_first", "value_first")
        }
        for arm in ARMS
    }
    return {**summary, "entities": entities, "minutes": round(minutes, 1)}


def _mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.fmean(present), 4) if present else None


if __name__ == "__main__":
    raise SystemExit(main())
