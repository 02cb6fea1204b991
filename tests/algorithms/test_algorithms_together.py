"""Every new algorithm at once (activation checkpointing, bf16 mixed precision, child tuning,
gradient clipping, EMA) in one process and on 2 ranks (FSDP2 and DDP), through eval and a
checkpoint round trip; ChildTuning-F keeps DDP replicas identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.tensor import DTensor

from cadence import dist
from cadence.algorithms import (
    EMA, ActivationCheckpointing, ChildTuning, GradientClipping, MixedPrecision,
)
from cadence.algorithms.activation_checkpointing import is_checkpointed
from cadence.checkpoint import save_checkpoint
from cadence.loggers import InMemoryLogger
from tests.algorithms.algorithm_helpers import full, run_trainer, tiny_gpt, token_loader


def _all_algorithms(mode: str = "D") -> list[Any]:
    # child_tuning before gradient_clipping: on AFTER_TRAIN_BATCH (reversed) clip, then mask
    return [ActivationCheckpointing(), MixedPrecision("amp_bf16"),
            ChildTuning(mode=mode, reserve_p=0.3, fisher_batches=2),
            GradientClipping("norm", 1.0), EMA(half_life="2ba")]


def _fit_all(tmp_path: Path, parallelism_config: Any = None, mode: str = "D") -> Any:
    memory = InMemoryLogger()
    model = tiny_gpt(dropout=0.1)
    trainer = run_trainer(model, _all_algorithms(mode), steps=4, loggers=[memory],
                          log_interval="1ba", eval_dataloader=token_loader(),
                          eval_interval="2ba", parallelism_config=parallelism_config)
    state = trainer.state
    assert state.timestamp.batch == 4 and state.precision == "amp_bf16"
    assert sum(is_checkpointed(m) for m in model.modules()) == 2
    losses = [v for _, v in memory.data["loss/train/total"]]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert "metrics/eval/LanguageCrossEntropy" in memory.data
    assert all(torch.isfinite(full(p)).all() for p in state.model.parameters())
    # checkpoint round trip: every algorithm's state comes back
    path = save_checkpoint(state, tmp_path / "all", "sharded")
    again = _all_algorithms(mode)
    loaded = run_trainer(tiny_gpt(dropout=0.1), again, steps=4, fit=False,
                         parallelism_config=parallelism_config, load_path=str(path))
    assert loaded.state.timestamp.batch == 4
    child, ema = state.algorithms[2], state.algorithms[4]
    child2, ema2 = again[2], again[4]
    assert child2.masks.keys() == child.masks.keys()
    assert all(torch.equal(full(child2.masks[n]), full(m)) for n, m in child.masks.items())
    assert all(torch.equal(full(ema2.shadow[n]), full(t)) for n, t in ema.shadow.items())
    return trainer


def test_all_together_single_process(tmp_path: Path) -> None:
    _fit_all(tmp_path)


@pytest.mark.world_size(2)
def test_all_together_fsdp_and_ddp(tmp_path: Path) -> None:
    trainer = _fit_all(tmp_path / "fsdp", {"fsdp": {}})
    child, ema = trainer.state.algorithms[2], trainer.state.algorithms[4]
    assert all(isinstance(m, DTensor) for m in child.masks.values())
    params = dict(trainer.state.model.named_parameters())
    assert all(isinstance(ema.shadow[n], DTensor) for n in params)
    # DDP with ChildTuning-F: every rank draws the same mask, so replicas stay identical
    trainer = _fit_all(tmp_path / "ddp", None, mode="F")
    assert isinstance(trainer.state.model, torch.nn.parallel.DistributedDataParallel)
    for name, p in trainer.state.model.module.named_parameters():
        gathered = dist.all_gather(p.detach().contiguous())
        assert torch.equal(gathered[0], gathered[1]), name
