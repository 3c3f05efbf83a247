"""The weight push's bookkeeping and its verification, without vLLM.

The verification has two halves that run in different processes and libraries: the sidecar
reads each tensor back from its engine with torch (`sidecar_server.read_fingerprints`, one call
per tensor-parallel rank), the trainer digests the same region of the pushed file with numpy
(`PushDir.expected_digest`). Here fake vLLM workers hold torch shards laid out as vLLM lays them
out (vocabulary-parallel embedding with padding rows, a row-parallel linear, a replicated norm),
and the two halves must agree exactly, and disagree when one element of one shard is stale.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from dynamo_jax.errors import SidecarError
from dynamo_jax.rollout import sidecar_server, weight_push, wire
from dynamo_jax.rollout.weight_push import compare_fingerprints


def test_shard_region_hand_worked():
    # Replicated: the whole tensor on every rank.
    assert wire.shard_region([256, 64], [256, 64], 3) == (0, 0, 256)
    # Row-parallel linear [out 8, in 12] over 2 ranks: rank 1 holds input columns 6..11.
    assert wire.shard_region([8, 12], [8, 6], 1) == (1, 6, 6)
    # Vocabulary 250 padded to 256 over 2 ranks of 128 rows: rank 1 holds rows 128..249 in its
    # first 122 rows (250 - 128), then 6 padding rows.
    assert wire.shard_region([250, 8], [128, 8], 1) == (0, 128, 122)
    # Over 4 ranks of 64: rank 3 starts at 192 and holds 250 - 192 = 58 real rows.
    assert wire.shard_region([250, 8], [64, 8], 3) == (0, 192, 58)
    # Padding only (TP = 1, vocabulary 250 padded to 256): the first 250 rows.
    assert wire.shard_region([250, 8], [256, 8], 0) == (0, 0, 250)
    assert wire.shard_region([8, 12], [4, 6], 0) is None  # two dimensions differ: not a block
    assert wire.shard_region([8, 12], [8, 12, 1], 0) is None
    assert wire.shard_region([250, 8], [128, 8], 2) is None  # a rank past the tensor


class FakeWorker:
    """What read_fingerprints uses of a vLLM worker: get_model().named_parameters()."""

    def __init__(self, params: dict[str, torch.Tensor]):
        self.params = {n: torch.nn.Parameter(v, requires_grad=False) for n, v in params.items()}

    def get_model(self):
        return self

    def named_parameters(self):
        return iter(self.params.items())


def _file_tensors(rng) -> dict[str, np.ndarray]:
    return {
        "model.embed_tokens.weight": rng.standard_normal((10, 4)).astype(np.float32),
        "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((4, 6)).astype(np.float32),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((4, 4)).astype(np.float32),
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((4, 6)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(4).astype(np.float32),
    }


def _shards(tensors, engine_dtype, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank` of 2 as vLLM holds it: vocabulary 10 padded to 16, rows 8 per rank; o_proj
    split along its input; norm replicated; q_proj fused away (absent); down_proj repacked by
    the kernel (an empty tensor left behind, as vLLM's CPU linear layers do)."""
    t = {k: torch.from_numpy(v).to(engine_dtype) for k, v in tensors.items()}
    embed = torch.full((8, 4), 99.0, dtype=engine_dtype)  # padding rows hold anything
    real = t["model.embed_tokens.weight"][8 * rank : 8 * rank + 8]
    embed[: len(real)] = real
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.self_attn.o_proj.weight": t["model.layers.0.self_attn.o_proj.weight"][
            :, 3 * rank : 3 * rank + 3
        ].contiguous(),
        "model.layers.0.mlp.down_proj.weight": torch.empty(0, dtype=engine_dtype),
        "model.norm.weight": t["model.norm.weight"].clone(),
    }


def _fingerprint_reply(monkeypatch, push, workers, version):
    names = push.check_names()
    header = push.header()
    ranks = []
    for rank, worker in enumerate(workers):
        monkeypatch.setattr(sidecar_server, "tp_rank", lambda rank=rank: rank)
        full = {n: header[n]["shape"] for n in names}
        ranks.append(sidecar_server.read_fingerprints(worker, names, full))
    return {"weight_version": version, "ranks": ranks}


@pytest.mark.parametrize(
    "file_dtype, engine_dtype",
    [
        (np.float32, torch.float32),
        (np.float32, torch.bfloat16),
        (ml_dtypes.bfloat16, torch.bfloat16),
    ],
)
def test_sidecar_and_trainer_digests_agree_per_rank_and_catch_a_stale_shard(
    monkeypatch, tmp_path, file_dtype, engine_dtype
):
    tensors = {k: v.astype(file_dtype) for k, v in _file_tensors(np.random.default_rng(0)).items()}
    push = weight_push.write_push_dir(tensors, str(tmp_path), version=3, tag="t")
    as_float = {k: v.astype(np.float32) for k, v in tensors.items()}
    workers = [FakeWorker(_shards(as_float, engine_dtype, rank)) for rank in range(2)]
    reply = _fingerprint_reply(monkeypatch, push, workers, version=3)
    states = {n: e["state"] for n, e in reply["ranks"][1]["tensors"].items()}
    assert states == {
        "model.embed_tokens.weight": "ok",
        "model.layers.0.mlp.down_proj.weight": "unreadable",
        "model.layers.0.self_attn.o_proj.weight": "ok",
        "model.layers.0.self_attn.q_proj.weight": "absent",
        "model.norm.weight": "ok",
    }
    # 3 readable tensors x 2 ranks, each compared exactly.
    assert compare_fingerprints(push, reply, "sidecar 1") == 6

    # One element of rank 1's embedding rows (a real row, not padding) left at its old value.
    stale = dict(_shards(as_float, engine_dtype, 1))
    stale["model.embed_tokens.weight"][1, 2] += 0.5
    reply = _fingerprint_reply(monkeypatch, push, [workers[0], FakeWorker(stale)], version=3)
    with pytest.raises(SidecarError, match=r"sidecar 1 does not serve .* version 3: tensor "
                       r"model\.embed_tokens\.weight \(tensor-parallel rank 1"):  # fmt: skip
        compare_fingerprints(push, reply, "sidecar 1")

    # Padding rows are not compared: changing one changes nothing.
    padded = dict(_shards(as_float, engine_dtype, 1))
    padded["model.embed_tokens.weight"][5, 0] = -7.0  # rank 1 holds 2 real rows, 6 padding
    reply = _fingerprint_reply(monkeypatch, push, [workers[0], FakeWorker(padded)], version=3)
    assert compare_fingerprints(push, reply, "sidecar 1") == 6


def test_verification_that_reads_nothing_or_the_wrong_version_is_an_error(monkeypatch, tmp_path):
    tensors = _file_tensors(np.random.default_rng(1))
    push = weight_push.write_push_dir(tensors, str(tmp_path), version=4, tag="t")
    shards = _shards(tensors, torch.float32, 0)
    good = _fingerprint_reply(monkeypatch, push, [FakeWorker(shards)], version=4)
    with pytest.raises(SidecarError, match="reports weight version 3 after the push of version 4"):
        compare_fingerprints(push, {**good, "weight_version": 3}, "sidecar 0")
    nothing = {n: torch.empty(0) for n in shards}  # every tensor repacked away
    reply = _fingerprint_reply(monkeypatch, push, [FakeWorker(nothing)], version=4)
    with pytest.raises(SidecarError, match="could not read any of 5 tensors"):
        compare_fingerprints(push, reply, "sidecar 0")
    wrong = dict(shards, **{"model.norm.weight": torch.zeros(3)})  # a shape no rank can hold
    reply = _fingerprint_reply(monkeypatch, push, [FakeWorker(wrong)], version=4)
    with pytest.raises(SidecarError, match=r"model\.norm\.weight .* shape \[3\]"):
        compare_fingerprints(push, reply, "sidecar 0")


def test_check_names_reads_back_first_middle_and_last_layer():
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"] + [
        f"model.layers.{i}.{part}.weight"
        for i in range(5)
        for part in ("input_layernorm", "self_attn.q_proj", "mlp.down_proj")
    ]
    picked = weight_push.check_names(names)
    layers = sorted({int(n.split(".")[2]) for n in picked if n.startswith("model.layers.")})
    assert layers == [0, 2, 4]  # 5 layers: first, 5 // 2, last
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"} <= set(picked)
    assert len(picked) == 3 + 3 * 3


def test_stale_push_dirs_of_this_run_only_are_removed(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    mine, other_process = (
        weight_push.push_tag(tmp_path / "w", 0),
        weight_push.push_tag(tmp_path / "w", 1),
    )
    other_run = weight_push.push_tag(tmp_path / "w2", 0)
    assert len({mine, other_process, other_run}) == 3
    assert weight_push.push_tag(tmp_path / "w" / ".." / "w", 0) == mine  # resolved path
    left = [weight_push.write_push_dir({"a": np.ones(2)}, str(shm), v, mine) for v in (3, 4)]
    keep = [
        weight_push.write_push_dir({"a": np.ones(2)}, str(shm), 3, tag)
        for tag in (other_process, other_run)
    ]
    (shm / "unrelated").mkdir()
    removed = weight_push.remove_stale_push_dirs(shm, mine)
    assert sorted(removed) == sorted(p.directory for p in left)
    assert not any(p.directory.exists() for p in left)
    assert all(p.directory.exists() for p in keep) and (shm / "unrelated").exists()
    assert weight_push.remove_stale_push_dirs(shm, mine) == []


def test_a_large_tensor_is_compared_on_every_kth_row(monkeypatch, tmp_path):
    """Above 2**21 elements both sides digest rows 0, k, 2k, ... with the same k, bounding the
    read-back to ~8 MB per tensor: a stale tensor (AdamW moves every element at every step) is
    caught; a change confined to unsampled rows is not (the price of the bound)."""
    big = np.random.default_rng(2).standard_normal((4100, 1024)).astype(np.float32)
    # 4,198,400 elements / 2,097,152 = 2.002 -> every 3rd row: 1,367 rows.
    assert wire.digest_step([4100, 1024]) == 3
    push = weight_push.write_push_dir({"model.embed_tokens.weight": big}, str(tmp_path), 1, "t")
    name = "model.embed_tokens.weight"

    def reply(table):
        return _fingerprint_reply(monkeypatch, push, [FakeWorker({name: table})], version=1)

    assert compare_fingerprints(push, reply(torch.from_numpy(big.copy())), "sidecar 0") == 1
    stale = torch.from_numpy(big * np.float32(1 - 1e-6))
    with pytest.raises(SidecarError, match="tensor model.embed_tokens.weight"):
        compare_fingerprints(push, reply(stale), "sidecar 0")
    sampled, skipped = torch.from_numpy(big.copy()), torch.from_numpy(big.copy())
    sampled[3, 0] += 1.0
    skipped[4, 0] += 1.0
    with pytest.raises(SidecarError, match="tensor model.embed_tokens.weight"):
        compare_fingerprints(push, reply(sampled), "sidecar 0")
    assert compare_fingerprints(push, reply(skipped), "sidecar 0") == 1
