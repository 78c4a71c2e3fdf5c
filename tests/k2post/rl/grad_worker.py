"""One process of the RL trainer-gradient test (tests/k2post/rl/test_trainer_gradient.py).

    python tests/k2post/rl/grad_worker.py --model DIR --ptx DIR --out DIR --stage 1 --rank R --port P
    python tests/k2post/rl/grad_worker.py --model DIR --ptx DIR --out DIR --reference

A rank builds the real `RLTrainerWorker` (DeepSpeed + ZeroMuonClip, 2 gloo ranks), takes its shard of
the step's rows as the controller does (`shard_for_ranks`, `micro_batches`: 2 micro-batches of 2 rows),
and saves `loss_gradient` (the gradient `train_step` would apply, PTX included). The rows carry IS token
weights and one is masked out (loss.is_correction, docs/RL.md). The reference loads the same HF model alone
and saves autograd of the documented loss written out by hand, (1/N) sum_i m_i (A_i - tau sum_t w_t
(log pi - log pi_old)(y_t))^2 with N = sum_i m_i and pi = softmax(logits / T_i), + ptx_coef x the mean over ranks
of `ptx_loss` on each rank's PTX rows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

K, GROUPS, MICRO, WORLD, TAU, PTX_COEF, PTX_ROWS, STEP = 4, 2, 2, 2, 0.3, 0.5, 2, 1
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.2, 0.9, 0.4, 0.0]  # two groups of K = 4


def rows_and_offsets():
    """The step's 8 sequences (prompt tokens masked) and pi_old offsets (logp_old = logp_now - offset)."""
    from k2post.rl.batch import TrainSequence, group_advantages_of

    advantages = [a for g in range(GROUPS) for a in group_advantages_of(REWARDS[g * K : (g + 1) * K])]
    rows = []
    for i, adv in enumerate(advantages):
        n = 7 + 3 * (i % 3)  # unequal lengths: padding inside micro-batches
        tokens = [(17 * i + 5 * t) % 200 + 10 for t in range(n)]
        row = TrainSequence(tokens, [0, 0, 0] + [1] * (n - 3), adv, f"g{i // K}/{i % K}")
        row.token_weights = [0.4 + 0.3 * ((i + t) % 5) for t in range(n - 3)]  # truncated IS weights in (0, C]
        row.keep = i != 5  # the IS sequence mask drops one row
        row.temperature = 0.7 if i % 2 else 1.0  # pi is softmax(logits / T) of the temperature it was sampled at
        rows.append(row)
    offsets = [0.05 * (i - 3.5) for i in range(len(rows))]  # nonzero log-ratios: the tau term matters
    return rows, offsets


def config(model_dir: str, ptx_dir: str, stage: int, **sections):
    """The step's RL config; `sections` are merged over its top-level sections (tests/k2post/rl/zero3_worker.py)."""
    from k2post.config.loader import validate_config
    from k2post.rl.run_config import RLConfig

    raw = {
        "model": {"path": model_dir, "flavor": None},
        "envs": [{"name": "math"}],
        "rollout": {"samples_per_prompt": K, "agentic": {"max_turn_tokens": 32, "max_episode_tokens": 64}},
        "budget": {"default_max_tokens": 32},
        "loss": {
            "groups_per_step": GROUPS,
            "micro_batch_size": MICRO,
            "tau": TAU,
            "ptx_coef": PTX_COEF,
            "ptx_data": ptx_dir,
            "ptx_rows_per_step": PTX_ROWS,
        },
        "optim": {"lr": 0.01},
        "trainer": {"world_size": WORLD, "zero_stage": stage},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return validate_config(RLConfig, raw, "grad_worker")


def run_rank(args) -> None:
    from k2post.rl.batch import micro_batches, shard_for_ranks
    from k2post.rl.consistency import weighted_sum
    from k2post.rl.trainer import RLTrainerWorker

    worker = RLTrainerWorker(config(args.model, args.ptx, args.stage), args.model, args.rank, args.port)
    try:
        rows, offsets = rows_and_offsets()
        shard = shard_for_ranks(rows, WORLD)[args.rank]
        mine = shard_for_ranks(offsets, WORLD)[args.rank]
        tokens = worker.old_policy(shard)["token_logprobs"]
        old = [weighted_sum(t, r.token_weights) - o for t, r, o in zip(tokens, shard, mine)]  # as the controller
        grads = worker.loss_gradient(micro_batches(shard, MICRO), micro_batches(old, MICRO), STEP)
        if args.rank == 0:
            torch.save(grads, Path(args.out) / f"stage{args.stage}.pt")
    finally:
        worker.close()


def ptx_batches(model_dir: str, ptx_dir: str, pad_id: int):
    """Each rank's PTX batch at step STEP, chosen as the trainer's `_ptx_loss` documents it."""
    from k2post.models.loading import load_tokenizer
    from k2post.rl.ptx_rows import ptx_row_domains, select_ptx_rows
    from k2post.sft.config import SFTDataConfig
    from k2post.sft.data import load_sft_data
    from k2post.sft.packing import collate, pack_examples

    data_cfg = SFTDataConfig(path=ptx_dir, eval_fraction=0.0, packing=False, max_seq_len=2048)
    data = load_sft_data(data_cfg, load_tokenizer(model_dir))
    chosen = select_ptx_rows(
        data.train, ptx_row_domains(ptx_dir, data.report.rows), [], config(model_dir, ptx_dir, 1).seed
    )
    packed = pack_examples(chosen, 2048, False)
    out = []
    for rank in range(WORLD):
        first = (STEP * WORLD + rank) * PTX_ROWS
        out.append(collate([packed[(first + j) % len(packed)] for j in range(PTX_ROWS)], pad_id))
    return out


def run_reference(args) -> None:
    from k2post.models.loading import load_causal_lm, load_tokenizer
    from k2post.rl.batch import pad_rows
    from k2post.rl.batch import group_advantages_of
    from k2post.rl.losses import ptx_loss, shifted_logprobs
    from k2post.sft.packing import model_inputs

    torch.manual_seed(0)
    model = load_causal_lm(args.model, "float32").train()
    tokenizer = load_tokenizer(args.model)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    rows, offsets = rows_and_offsets()
    ids, masks = pad_rows([r.token_ids for r in rows], [r.loss_mask for r in rows], pad_id)
    input_ids, mask = torch.tensor(ids), torch.tensor(masks, dtype=torch.float32)
    temps = torch.tensor([r.temperature for r in rows])[:, None, None]
    logp = shifted_logprobs(model(input_ids=input_ids, use_cache=False).logits / temps, input_ids)  # [N, T]
    weights = torch.zeros_like(mask)
    for i, row in enumerate(rows):
        weights[i, mask[i].bool()] = torch.tensor(row.token_weights)
    advantages = torch.tensor([a for g in range(GROUPS) for a in group_advantages_of(REWARDS[g * K : (g + 1) * K])])
    log_ratio = (weights * (logp - logp.detach())).sum(-1) + torch.tensor(offsets)  # sum_t w_t (log pi - log pi_old)
    keep = torch.tensor([float(r.keep) for r in rows])
    loss = (keep * (advantages - TAU * log_ratio) ** 2).sum() / keep.sum()  # N counts the kept episodes only
    ptx = [ptx_loss(model(**model_inputs(b)).logits, b["labels"]) for b in ptx_batches(args.model, args.ptx, pad_id)]
    (loss + PTX_COEF * sum(ptx) / WORLD).backward()
    torch.save({n: p.grad.detach().clone() for n, p in model.named_parameters()}, Path(args.out) / "reference.pt")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--ptx", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stage", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    (run_reference if args.reference else run_rank)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
