"""A trained sentence-level faithfulness judge: a causal LM fine-tuned to answer " yes" or " no" after

    Claim: <one sentence>
    Evidence: <the source sentences sharing the most words with the claim, in source order>
    Claim: <the sentence again>
    Supported:

P(supported) = sigmoid(logit(" yes") - logit(" no")) at the last prompt token. Training (`train_judge`, what
`k2post judge train CONFIG` runs) minimizes binary cross-entropy of that margin on pairs from
k2post/judging/faithfulness_pairs.py, keeps the step with the best dev accuracy, and picks the decision threshold
on dev. The faithfulness gym (`judge: trained`) and the rephraser (`fidelity_judge: model`) load it with
`load_trained_judge`:

    judge = load_trained_judge("runs/judge/model")
    judge.supported_probs([("Kalo was born in 1931.", "Kalo's birth year is 1931.")])   # [0.97]

The evidence is the source cut to `evidence_tokens` (judge.json): its sentences sharing the most words with the claim,
in source order. The claim comes before the evidence and again after it, so that a causal model can compare each
evidence token with the claim and each claim token with the evidence.
"""

from __future__ import annotations

import copy
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from k2post.judging.faithfulness_config import JudgeTrainConfig
from k2post.judging.faithfulness_pairs import KINDS, JudgePair, make_pairs
from k2post.rephrase.chunking import split_sentences
from k2post.rephrase.corpus import build_corpus, render_rewrite
from k2post.train.config import LRScheduleConfig
from k2post.train.schedule import lr_factor

PROMPT = "Claim: {sentence}\nEvidence: {source}\nClaim: {sentence}\nSupported:"
LABEL_TEXTS = (" yes", " no")
META_FILE = "judge.json"
FORMAT_VERSION = 1
_WORD = re.compile(r"[A-Za-z0-9]+")
_FUNCTION = frozenset("a an the of in on at to for from by with and or is are was were be been has have had its it "
                      "this that these those there as since".split())  # fmt: skip


class JudgeModelError(ValueError):
    """A judge dir is missing or unusable (one-line message naming the path)."""


def label_token_ids(tokenizer: Any) -> tuple[int, int]:
    """The first token id of " yes" and of " no" (they must differ)."""
    yes, no = (tokenizer.encode(text, add_special_tokens=False)[0] for text in LABEL_TEXTS)
    if yes == no:
        raise JudgeModelError(f"the tokenizer maps ' yes' and ' no' to the same first token ({yes})")
    return yes, no


def _weighted_words(text: str) -> dict[str, int]:
    """Words of `text` with their weight: 2 for names and numbers (capitalized or with a digit), 1 for other words,
    0 for function words (which every sentence shares)."""
    weights = {}
    for word in _WORD.findall(text):
        lower = word.lower()
        weights[lower] = (
            2 if (word[0].isupper() or word[0].isdigit()) and lower not in _FUNCTION else int(lower not in _FUNCTION)
        )
    return weights


def _shared_weight(claim: dict[str, int], sentence: dict[str, int]) -> int:
    return sum(weight for word, weight in claim.items() if word in sentence)


def fit_source(source: str, claim: str, count_tokens: Callable[[str], int], budget: int) -> str:
    """`source` if it fits `budget` tokens, else its sentences sharing the most with `claim` (names and numbers count
    twice, function words not at all) that fit, in source order."""
    if count_tokens(source) <= budget:
        return source
    sentences = split_sentences(source)
    claim_words = _weighted_words(claim)
    ranked = sorted(range(len(sentences)), key=lambda i: -_shared_weight(claim_words, _weighted_words(sentences[i])))
    kept, used = set(), 0
    for index in ranked:
        size = count_tokens(sentences[index]) + 1
        if used + size <= budget:
            kept.add(index)
            used += size
    return " ".join(sentences[i] for i in sorted(kept))


def plain_ids(tokenizer: Any, text: str) -> list[int]:
    """Ids of untrusted `text` (a source, a claim) as plain text: a special-token string in it gives ordinary ids."""
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def encode_prompt(tokenizer: Any, source: str, claim: str, max_seq_len: int, evidence_tokens: int) -> list[int]:
    """Token ids of the judge prompt: the source cut to `evidence_tokens` (and to what `max_seq_len` leaves; the
    claim is cut only when it alone does not fit). Source and claim are tokenized as plain text (`plain_ids`)."""
    frame = len(plain_ids(tokenizer, PROMPT.format(source="", sentence=claim)))
    count = lambda text: len(plain_ids(tokenizer, text))  # noqa: E731
    source = fit_source(source, claim, count, max(0, min(evidence_tokens, max_seq_len - frame)))
    return plain_ids(tokenizer, PROMPT.format(source=source, sentence=claim))[-max_seq_len:]


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids (B, T), attention mask (B, T) and the index of each row's last real token (B,)."""
    width = max(len(seq) for seq in seqs)
    ids_BT = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids_BT[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask_BT[row, : len(seq)] = 1
    return ids_BT, mask_BT, mask_BT.sum(dim=1) - 1


def yes_no_margin(
    model: Any, ids_BT: torch.Tensor, mask_BT: torch.Tensor, last_B: torch.Tensor, label_ids: tuple[int, int]
) -> torch.Tensor:
    """logit(yes) - logit(no) at each row's last prompt token (B,)."""
    hidden_BTD = model.model(input_ids=ids_BT, attention_mask=mask_BT).last_hidden_state
    last_BD = hidden_BTD[torch.arange(ids_BT.shape[0]), last_B]
    logits_B2 = model.lm_head(last_BD)[:, list(label_ids)]
    return logits_B2[:, 0] - logits_B2[:, 1]


def judge_loss(margin_B: torch.Tensor, supported_B: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of P(supported) = sigmoid(margin) against the labels (1 = supported)."""
    return F.binary_cross_entropy_with_logits(margin_B, supported_B.float())


def best_threshold(probs: Sequence[float], labels: Sequence[bool]) -> tuple[float, float]:
    """The threshold in 0.05..0.95 with the highest accuracy (ties: closest to 0.5), and that accuracy."""
    grid = [round(0.05 * k, 2) for k in range(1, 20)]
    scored = [(accuracy(probs, labels, t), -abs(t - 0.5), t) for t in grid]
    acc, _, threshold = max(scored)
    return threshold, acc


def accuracy(probs: Sequence[float], labels: Sequence[bool], threshold: float) -> float:
    """Fraction of pairs where (prob >= threshold) equals the label."""
    return sum((p >= threshold) == bool(y) for p, y in zip(probs, labels)) / max(1, len(labels))


class TrainedSentenceJudge:
    """A fine-tuned judge: P(supported) of (source, sentence) pairs, and the threshold picked on dev."""

    name = "trained"

    def __init__(self, model: Any, tokenizer: Any, meta: dict[str, Any]) -> None:
        self.model, self.tokenizer, self.meta = model.eval(), tokenizer, meta
        self.label_ids = (int(meta["yes_id"]), int(meta["no_id"]))
        self.threshold = float(meta["threshold"])
        self.max_seq_len = int(meta["max_seq_len"])
        self.evidence_tokens = int(meta["evidence_tokens"])
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id)

    def encode(self, source: str, claim: str) -> list[int]:
        """The prompt ids of one pair."""
        return encode_prompt(self.tokenizer, source, claim, self.max_seq_len, self.evidence_tokens)

    def margins(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> torch.Tensor:
        """logit(yes) - logit(no) per pair (N,), batched without gradients."""
        out = []
        with torch.no_grad():
            for start in range(0, len(pairs), batch_size):
                chunk = pairs[start : start + batch_size]
                seqs = [self.encode(source, claim) for source, claim in chunk]
                out.append(yes_no_margin(self.model, *pad_batch(seqs, self.pad_id), self.label_ids))
        return torch.cat(out) if out else torch.zeros(0)

    def supported_probs(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32) -> list[float]:
        """P(supported) of each (source, sentence) pair."""
        return torch.sigmoid(self.margins(pairs, batch_size)).tolist()

    def save(self, out_dir: str | Path) -> Path:
        """HF model + tokenizer + judge.json into `out_dir`."""
        out = Path(out_dir)
        self.model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        (out / META_FILE).write_text(json.dumps(self.meta, indent=2) + "\n")
        return out


def judge_dir(path: str | Path) -> Path:
    """The dir holding judge.json: `path` itself or its `model/` (a `k2post judge train` out_dir)."""
    path = Path(path)
    for candidate in (path, path / "model"):
        if (candidate / META_FILE).is_file():
            return candidate
    raise JudgeModelError(
        f"{path}: not a trained faithfulness judge (no {META_FILE} here or in model/): train one with "
        "`k2post judge train CONFIG`"
    )


def load_trained_judge(path: str | Path) -> TrainedSentenceJudge:
    """Load a judge saved by `k2post judge train` (its out_dir or out_dir/model)."""
    from k2post.models.loading import load_causal_lm, load_tokenizer

    folder = judge_dir(path)
    meta = json.loads((folder / META_FILE).read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise JudgeModelError(f"{folder / META_FILE}: format_version {meta.get('format_version')} != {FORMAT_VERSION}")
    return TrainedSentenceJudge(load_causal_lm(folder), load_tokenizer(folder), meta)


@lru_cache(maxsize=4)
def cached_trained_judge(path: str) -> TrainedSentenceJudge:
    """One loaded judge per path and process (reward workers score many responses)."""
    return load_trained_judge(path)


# --------------------------------------------------------------------------- training


def _pairs(cfg: JudgeTrainConfig) -> tuple[list[JudgePair], list[JudgePair]]:
    data = cfg.data
    train = make_pairs(build_corpus(data.train_entities, data.corpus_seed), data.train_pairs, cfg.seed)
    dev = make_pairs(build_corpus(data.dev_entities, data.corpus_seed + 1), data.dev_pairs, cfg.seed + 1)
    return train, dev


def evaluate_pairs(judge: TrainedSentenceJudge, pairs: Sequence[JudgePair]) -> dict[str, float]:
    """Accuracy at the judge's threshold, overall and per pair kind."""
    probs = judge.supported_probs([(p.source, p.sentence) for p in pairs])
    out = {"acc": accuracy(probs, [p.supported for p in pairs], judge.threshold)}
    for kind in KINDS:
        chosen = [(prob, p.supported) for prob, p in zip(probs, pairs) if p.kind == kind]
        if chosen:
            out[f"acc/{kind}"] = accuracy(*zip(*chosen), judge.threshold)
    return out


def _step(judge: TrainedSentenceJudge, batch: Sequence[JudgePair], optimizer: torch.optim.Optimizer) -> float:
    seqs = [judge.encode(p.source, p.sentence) for p in batch]
    margin_B = yes_no_margin(judge.model, *pad_batch(seqs, judge.pad_id), judge.label_ids)
    loss = judge_loss(margin_B, torch.tensor([p.supported for p in batch]))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(judge.model.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach())


def lm_documents(cfg: JudgeTrainConfig) -> list[str]:
    """The LM phase's text: every train-corpus document in `lm_wordings` wordings."""
    corpus = build_corpus(cfg.data.train_entities, cfg.data.corpus_seed)
    return [render_rewrite(entity, k) for k in range(cfg.train.lm_wordings) for entity in corpus]


def _schedule(warmup_steps: int) -> LRScheduleConfig:
    """SFT's and RL's schedule (k2post/train/schedule.py): linear warmup, cosine decay to 10% of the peak."""
    return LRScheduleConfig(kind="cosine", warmup_steps=warmup_steps, min_lr_ratio=0.1)


def _lm_step(judge: TrainedSentenceJudge, texts: Sequence[str], optimizer: torch.optim.Optimizer) -> float:
    """One next-token step on `texts` (each + end of text; padding out of the loss)."""
    eos = int(judge.tokenizer.eos_token_id)
    seqs = [[*plain_ids(judge.tokenizer, t)[: judge.max_seq_len - 1], eos] for t in texts]
    ids_BT, mask_BT, _ = pad_batch(seqs, judge.pad_id)
    loss = judge.model(input_ids=ids_BT, attention_mask=mask_BT, labels=ids_BT.masked_fill(mask_BT == 0, -100)).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(judge.model.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach())


def _lm_phase(judge: TrainedSentenceJudge, cfg: JudgeTrainConfig, log: Callable[[dict[str, Any]], None] | None) -> None:
    """`lm_steps` next-token steps on the corpus documents (own AdamW, warmup and cosine decay)."""
    if cfg.train.lm_steps == 0:
        return
    docs, rng, loop = lm_documents(cfg), random.Random(cfg.seed + 1), cfg.train
    optimizer = torch.optim.AdamW(judge.model.parameters(), lr=loop.lr, weight_decay=loop.weight_decay)
    for step in range(loop.lm_steps):
        for group in optimizer.param_groups:
            group["lr"] = loop.lr * lr_factor(step, loop.lm_steps, _schedule(min(loop.warmup_steps, loop.lm_steps - 1)))
        loss = _lm_step(judge, rng.sample(docs, min(loop.batch_size, len(docs))), optimizer)
        if log is not None:
            log({"lm_step": step + 1, "lm_loss": loss})


def _dev_check(judge: TrainedSentenceJudge, dev: Sequence[JudgePair]) -> tuple[float, float]:
    judge.model.eval()
    probs = judge.supported_probs([(p.source, p.sentence) for p in dev])
    judge.model.train()
    return best_threshold(probs, [p.supported for p in dev])


def _start(cfg: JudgeTrainConfig) -> TrainedSentenceJudge:
    from k2post.models.loading import ensure_model, load_causal_lm, load_tokenizer

    folder = ensure_model(cfg.model)
    tokenizer = load_tokenizer(folder)
    yes_id, no_id = label_token_ids(tokenizer)
    meta = {"format_version": FORMAT_VERSION, "yes_id": yes_id, "no_id": no_id, "threshold": 0.5,
            "max_seq_len": cfg.train.max_seq_len,
            "evidence_tokens": cfg.train.evidence_tokens, "prompt": PROMPT, "base_model": str(folder)}  # fmt: skip
    judge = TrainedSentenceJudge(load_causal_lm(folder), tokenizer, meta)
    judge.model.train()
    return judge


def train_judge(cfg: JudgeTrainConfig, log: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Fine-tune `cfg.model` into a judge; save the best-dev-step model with its threshold to out_dir/model."""
    torch.manual_seed(cfg.seed)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    train, dev = _pairs(cfg)
    judge = _start(cfg)
    _lm_phase(judge, cfg, log)
    optimizer = torch.optim.AdamW(judge.model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    rng, order, best = random.Random(cfg.seed), [], (-1.0, 0.5, None, 0)
    started = time.monotonic()
    for step in range(cfg.train.steps):
        if len(order) < cfg.train.batch_size:
            order += rng.sample(range(len(train)), len(train))
        batch, order = [train[i] for i in order[: cfg.train.batch_size]], order[cfg.train.batch_size :]
        for group in optimizer.param_groups:
            group["lr"] = cfg.train.lr * lr_factor(step, cfg.train.steps, _schedule(cfg.train.warmup_steps))
        record: dict[str, Any] = {"step": step + 1, "loss": _step(judge, batch, optimizer)}
        if (step + 1) % cfg.train.eval_every == 0 or step + 1 == cfg.train.steps:
            threshold, dev_acc = _dev_check(judge, dev)
            record.update(dev_acc=dev_acc, threshold=threshold)
            if dev_acc > best[0]:
                best = (dev_acc, threshold, copy.deepcopy(judge.model.state_dict()), step + 1)
        if log is not None:
            log(record)
    judge.model.load_state_dict(best[2])
    judge.meta.update(threshold=best[1], dev_acc=best[0], best_step=best[3], steps=cfg.train.steps)
    judge.threshold = best[1]
    judge.save(Path(cfg.out_dir) / "model")
    return {**judge.meta, "seconds": round(time.monotonic() - started, 1), "train_pairs": len(train)}
