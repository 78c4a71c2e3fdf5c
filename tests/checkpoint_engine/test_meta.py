"""Unit tests: dtype codec, bucket planning, registration merging, metadata validation, checksum, config."""

from __future__ import annotations

import math
import random

import pytest
import torch
from pydantic import ValidationError

from k2post_checkpoint_engine.checksum import piece_digest, source_piece
from k2post_checkpoint_engine.config import CheckpointEngineConfig
from k2post_checkpoint_engine.errors import MetadataError
from k2post_checkpoint_engine.meta import (
    BucketMeta,
    PieceSpec,
    TensorMeta,
    bucket_meta_from_dict,
    dtype_from_str,
    dtype_to_str,
    group_pieces,
    plan_buckets,
    validate_bucket,
    validate_plan,
)
from k2post_checkpoint_engine.sources import merge_registrations

# ----------------------------------------------------------------------------- dtype codec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8])
def test_dtype_codec_roundtrip(dtype):
    assert dtype_from_str(dtype_to_str(dtype, "t"), "t") is dtype
    assert dtype_from_str(str(dtype), "t") is dtype  # "torch.float32" accepted


@pytest.mark.parametrize("bad", ["float13", "", "torch.nope", None, 5])
def test_unknown_dtype_names_the_tensor(bad):
    with pytest.raises(MetadataError, match="layer.0.w"):
        dtype_from_str(bad, "layer.0.w")


# ----------------------------------------------------------------------------- planning


def _check_plan_invariants(pieces: list[PieceSpec], plan: list[BucketMeta], cap: int, align: int) -> None:
    validate_plan(plan, cap)
    for b in plan:
        assert b.nbytes <= cap
        assert b.tensors
        assert all(t.offset % align == 0 for t in b.tensors)
        assert len({t.name for t in b.tensors}) == len(b.tensors)  # a piece is never split inside a bucket
    by_name = group_pieces(plan)
    for p in pieces:
        nbytes = p.piece_numel * torch.empty(0, dtype=dtype_from_str(p.dtype, p.name)).element_size()
        if nbytes <= cap:  # fits a bucket -> never split
            owned = [t for t in by_name[p.name] if t.start == p.start]
            assert len(owned) == 1 and owned[0].nbytes == nbytes


@pytest.mark.parametrize("cap", [64, 100, 1000, 4099, 65537])
def test_plan_odd_bucket_sizes_random_specs(cap):
    rng = random.Random(cap)
    dtypes = ["float32", "bfloat16", "int64", "bool", "float16", "uint8"]
    pieces = [
        PieceSpec(
            f"t{i}", rng.choice(dtypes), tuple(rng.randint(0, 9) for _ in range(rng.randint(0, 3))), rng.randint(0, 2)
        )
        for i in range(60)
    ]
    pieces.append(PieceSpec("huge", "float32", (cap // 2 + 3, 3), 1))
    plan = plan_buckets(pieces, cap, 64)
    _check_plan_invariants(pieces, plan, cap, 64)
    assert [b.owner for b in plan] == sorted(b.owner for b in plan)  # owner-major
    assert plan_buckets(list(pieces), cap, 64) == plan  # deterministic


def test_tensor_bigger_than_bucket_is_split_over_consecutive_buckets():
    plan = plan_buckets([PieceSpec("small", "float32", (3,), 0), PieceSpec("big", "float32", (1000,), 0)], 1000, 64)
    big = [(b.index, t) for b in plan for t in b.tensors if t.name == "big"]
    assert [i for i, _ in big] == list(range(big[0][0], big[0][0] + len(big)))
    assert sum(t.nbytes for _, t in big) == 4000
    assert [t.start for _, t in big] == sorted(t.start for _, t in big)
    assert plan[0].tensors[0].name == "small" and plan[0].tensors[1].offset == 64  # rest of bucket 0 used


def test_small_tensor_not_split_when_it_fits_a_fresh_bucket():
    plan = plan_buckets([PieceSpec("a", "uint8", (900,), 0), PieceSpec("b", "uint8", (200,), 0)], 1000, 64)
    assert [[t.name for t in b.tensors] for b in plan] == [["a"], ["b"]]


def test_alignment_and_bad_args():
    plan = plan_buckets([PieceSpec(f"t{i}", "uint8", (1,), 0) for i in range(5)], 4096, 256)
    assert [t.offset for t in plan[0].tensors] == [0, 256, 512, 768, 1024]
    with pytest.raises(ValueError, match="power of two"):
        plan_buckets([], 4096, 48)
    with pytest.raises(MetadataError, match="'x'"):
        plan_buckets([PieceSpec("x", "complex128", (1,), 0)], 8, 16)


# ----------------------------------------------------------------------------- merging registrations


def _reg(name, kind="full", dtype="float32", shape=(4,), start=0, numel=None, owner=None, collective=False):
    numel = math.prod(shape) if numel is None else numel
    return {"name": name, "kind": kind, "dtype": dtype, "shape": list(shape), "start": start, "numel": numel,
            "owner": owner, "collective": collective}  # fmt: skip


def test_merge_is_identical_on_every_rank_and_balances_owners():
    per_rank = [[_reg("a", shape=(100,)), _reg("b", shape=(10,)), _reg("only0")],
                [_reg("a", shape=(100,)), _reg("b", shape=(10,)), _reg("only1", owner=1)]]  # fmt: skip
    pieces = merge_registrations(per_rank, None)
    assert pieces == merge_registrations([list(r) for r in per_rank], None)
    owners = {p.name: p.owner for p in pieces}
    assert owners == {"a": 0, "b": 1, "only0": 0, "only1": 1}


def test_merge_shards_and_cast():
    per_rank = [
        [_reg("w", "shard", shape=(3, 4), start=0, numel=5)],
        [_reg("w", "shard", shape=(3, 4), start=5, numel=7)],
    ]
    pieces = merge_registrations(per_rank, "bfloat16")
    assert [(p.owner, p.start, p.numel, p.dtype) for p in pieces] == [(0, 0, 5, "bfloat16"), (1, 5, 7, "bfloat16")]
    ints = merge_registrations([[_reg("i", dtype="int64")]], "bfloat16")
    assert ints[0].dtype == "int64"  # only floating tensors are cast


@pytest.mark.parametrize(
    "per_rank, match",
    [
        ([[_reg("w", shape=(4,))], [_reg("w", shape=(5,))]], "'w'.*shape"),
        ([[_reg("w")], [_reg("w", dtype="bfloat16")]], "'w'.*dtype"),
        ([[_reg("w")], [_reg("w", "shard", numel=2)]], "'w'.*kind"),
        ([[_reg("w", owner=1)], []], "'w'.*owner=1"),
        ([[_reg("w", "fn", collective=True)], []], "'w'.*ranks \\[1\\]"),
    ],
)
def test_merge_rejects_inconsistent_registrations(per_rank, match):
    with pytest.raises(ValueError, match=match):
        merge_registrations(per_rank, None)


# ----------------------------------------------------------------------------- validation


def _bucket(*tensors: TensorMeta, nbytes: int | None = None) -> BucketMeta:
    end = max((t.offset + t.nbytes for t in tensors), default=0)
    return BucketMeta(0, 0, end if nbytes is None else nbytes, tensors)


@pytest.mark.parametrize(
    "tensor, match",
    [
        (TensorMeta("w.over", "float32", (300,), 0, 1200), "'w.over'.*overrun"),
        (TensorMeta("w.neg", "float32", (4,), -64, 16), "'w.neg'.*negative"),
        (TensorMeta("w.mis", "float32", (4,), 2, 16), "'w.mis'.*multiple of itemsize"),
        (TensorMeta("w.nb", "float32", (4,), 0, 15), "'w.nb'.*multiple of itemsize"),
        (TensorMeta("w.numel", "float32", (4,), 0, 20), "'w.numel'.*exceed numel"),
        (TensorMeta("w.dtype", "float13", (4,), 0, 16), "'w.dtype'.*unknown dtype"),
        (TensorMeta("w.shape", "float32", (-1, 4), 0, 16), "'w.shape'.*negative dimension"),
    ],
)
def test_validate_bucket_names_the_tensor(tensor, match):
    with pytest.raises(MetadataError, match=match):
        validate_bucket(_bucket(tensor), 1024)


def test_validate_bucket_overlap_and_extent():
    a, b = TensorMeta("a", "float32", (8,), 0, 32), TensorMeta("b", "float32", (8,), 16, 32)
    with pytest.raises(MetadataError, match="'b'.*overlaps tensor 'a'"):
        validate_bucket(_bucket(a, b), 1024)
    with pytest.raises(MetadataError, match="bucket 0 \\(last tensor 'a'\\): nbytes 2048 overruns"):
        validate_bucket(_bucket(a, nbytes=2048), 1024)
    with pytest.raises(MetadataError, match="'a'.*overrun the bucket"):
        validate_bucket(_bucket(a, nbytes=16), 1024)


def test_validate_plan_coverage_and_expectations():
    whole = TensorMeta("w", "float32", (2, 4), 0, 32)
    validate_plan([_bucket(whole)], 1024, {"w": ((2, 4), torch.float32)})
    with pytest.raises(MetadataError, match="'w'.*cover 4 of 8"):
        validate_plan([_bucket(TensorMeta("w", "float32", (2, 4), 0, 16))], 1024)
    gap = [
        _bucket(TensorMeta("w", "float32", (2, 4), 0, 16)),
        BucketMeta(1, 0, 12, (TensorMeta("w", "float32", (2, 4), 0, 12, start=5),)),
    ]
    with pytest.raises(MetadataError, match="'w'.*gap at element 4"):
        validate_plan(gap, 1024)
    with pytest.raises(MetadataError, match="'w'.*shape \\[2, 4\\] != expected \\[4, 2\\]"):
        validate_plan([_bucket(whole)], 1024, {"w": ((4, 2), torch.float32)})
    with pytest.raises(MetadataError, match="'w'.*dtype float32 != expected bfloat16"):
        validate_plan([_bucket(whole)], 1024, {"w": ((2, 4), "bfloat16")})
    with pytest.raises(MetadataError, match="'w' is not expected"):
        validate_plan([_bucket(whole)], 1024, {"v": ((2, 4), torch.float32)})
    with pytest.raises(MetadataError, match="'v' expected by the receiver is missing"):
        validate_plan([_bucket(whole)], 1024, {"w": ((2, 4), torch.float32), "v": ((1,), torch.float32)})


@pytest.mark.parametrize(
    "raw, match",
    [
        (
            {"index": 0, "owner": 0, "nbytes": 4, "tensors": [{"name": "q", "dtype": "float32", "shape": "x"}]},
            "'q'.*shape",
        ),
        (
            {"index": 0, "owner": 0, "nbytes": 4, "tensors": [{"name": "q", "dtype": "f", "shape": [1]}]},
            "'q'.*unknown dtype",
        ),
        (
            {
                "index": 0,
                "owner": 0,
                "nbytes": 4,
                "tensors": [{"name": "q", "dtype": "float32", "shape": [1], "offset": 1.5}],
            },
            "'q'.*offset must be an int",
        ),
        ({"index": 0, "owner": 0, "nbytes": 4, "tensors": [{"dtype": "float32"}]}, "without a string name"),
        ({"index": 0}, "malformed bucket"),
    ],
)
def test_malformed_metadata_dicts(raw, match):
    with pytest.raises(MetadataError, match=match):
        bucket_meta_from_dict(raw)


def test_meta_json_roundtrip():
    plan = plan_buckets([PieceSpec("a", "bfloat16", (3, 5), 0), PieceSpec("b", "int64", (0,), 0)], 256, 64)
    assert [bucket_meta_from_dict(b.to_dict()) for b in plan] == plan


# ----------------------------------------------------------------------------- checksum


def test_piece_digest_sees_every_single_byte_flip_swap_and_move():
    buf = torch.randint(0, 256, (8 * 37,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    ref = piece_digest(buf)
    for i in range(buf.numel()):
        bad = buf.clone()
        bad[i] ^= 1 << (i % 8)
        assert piece_digest(bad) != ref, f"flip at byte {i} undetected"
    words = buf.view(torch.int64).clone()
    words[[0, 1]] = words[[1, 0]]
    assert piece_digest(words.view(torch.uint8)) != ref
    assert piece_digest(torch.roll(buf, 128)) != ref  # a move by a multiple of 128 bytes (the lane sum missed it)
    assert piece_digest(buf[:0]) != piece_digest(torch.zeros(8, dtype=torch.uint8))
    floats = torch.randn(10, 7)
    assert piece_digest(floats) == piece_digest(floats.view(torch.uint8).reshape(-1)) == piece_digest(floats.t().t())
    assert piece_digest(floats.t()) != piece_digest(floats)  # bytes in element order of the view


def test_source_piece_is_what_travels():
    source = torch.randn(4, 5)
    assert torch.equal(source_piece(source, 3, 6, torch.float32), source.reshape(-1)[3:9])
    assert source_piece(source, 0, 20, torch.bfloat16).dtype == torch.bfloat16


# ----------------------------------------------------------------------------- config


def test_config_validation():
    cfg = CheckpointEngineConfig(bucket_nbytes=4099, dtype="bfloat16")
    assert cfg.timeout_s > 0 and cfg.verify_checksum
    for bad in ({"bucket_nbytes": 4096, "typo": 1}, {"dtype": "float13"}, {"align_nbytes": 48}, {"shm_prefix": "a-b"}):
        with pytest.raises(ValidationError):
            CheckpointEngineConfig(**bad)
    for name, field in CheckpointEngineConfig.model_fields.items():
        assert field.description, name
