"""One trainer rank of the ZeRO-3 push test (tests/k2post/rl/test_zero3_push.py).

    python tests/k2post/rl/zero3_worker.py --model DIR --ptx DIR --out DIR --stage {2,3} --rank R --port P

Builds the real `RLTrainerWorker` (2 gloo ranks, DeepSpeed + ZeroMuonClip, INT4 QAT on the routed experts), takes
its shard of the gradient test's rows (tests/k2post/rl/grad_worker.py), runs pi_old and one optimizer step, then
pushes its weights through the checkpoint engine with verification: rank 0 writes its sender's address to
`addr_stage{S}.txt` for the test's vLLM engine to receive from. Every rank writes `mem_stage{S}_rank{R}.json` (its
peak RSS and the bytes the push moved); rank 0 also `digests_stage{S}.json` (what it served).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from grad_worker import MICRO, STEP, WORLD, rows_and_offsets  # noqa: E402


# ZeRO-3 gathers and reduces in small pieces, and NS batches stay small: the parameters set the peak (docs/SCALING.md)
ZERO3 = {
    "prefetch_bucket_numel": 0,
    "max_live_numel": 3_000_000,
    "max_reuse_distance": 0,
    "reduce_bucket_numel": 2_000_000,
}


def config(model_dir: str, ptx_dir: str, stage: int):
    import grad_worker

    return grad_worker.config(
        model_dir,
        ptx_dir,
        stage,
        optim={"ns_batch_numel": 1 << 22},
        qat={"enabled": True},
        trainer={"bucket_mb": 4, "zero3": ZERO3},
    )


def run_rank(args) -> None:
    from k2post.rl.batch import micro_batches, shard_for_ranks
    from k2post.rl.consistency import weighted_sum
    from k2post.rl.trainer import RLTrainerWorker

    out = Path(args.out)
    worker = RLTrainerWorker(config(args.model, args.ptx, args.stage), args.model, args.rank, args.port)
    try:
        rows, offsets = rows_and_offsets()
        shard = shard_for_ranks(rows, WORLD)[args.rank]
        mine = shard_for_ranks(offsets, WORLD)[args.rank]
        tokens = worker.old_policy(shard)["token_logprobs"]
        old = [weighted_sum(t, r.token_weights) - o for t, r, o in zip(tokens, shard, mine)]
        worker.train_step(micro_batches(shard, MICRO), micro_batches(old, MICRO), STEP)
        address = worker.open_push()
        if args.rank == 0:
            (out / f"addr_stage{args.stage}.txt.tmp").write_text(address)
            (out / f"addr_stage{args.stage}.txt.tmp").rename(out / f"addr_stage{args.stage}.txt")
        pushed = worker.push_weights(verify=True)
        if args.rank == 0:
            (out / f"digests_stage{args.stage}.json").write_text(json.dumps(pushed["digests"]))
        memory = {**worker.memory(), "nbytes": pushed["nbytes"], "params": worker.ready()["params"]}
        (out / f"mem_stage{args.stage}_rank{args.rank}.json").write_text(json.dumps(memory))
    finally:
        worker.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--model", "--ptx", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--stage", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    run_rank(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
