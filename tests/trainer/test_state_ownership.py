"""The State owns the run's state; the Trainer keeps no copy of it (issue 30).

Before, ``state.parallelism_config``, ``state.scaler`` and ``state.auto_microbatching`` were
never set (the Trainer kept private copies), so a Composer callback reading ``state.scaler``
under ``amp_fp16`` got ``None``, and ``cadence.utils.checkpoint.save_checkpoint(trainer.state)``
wrote one full file for an FSDP run whose ``Trainer.save_checkpoint`` wrote a sharded folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Callback, State, Trainer, dist
from cadence.loggers import Logger
from cadence.parallel import FSDPConfig, ParallelDims, ParallelismConfig
from cadence.utils.checkpoint import checkpoint_format, save_checkpoint
from tests.common.models import SimpleModel, make_dataloader


class ReadsState(Callback):
    """A Composer-style callback: what it sees on the state at FIT_START."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def fit_start(self, state: State, logger: Logger) -> None:
        self.seen = {"scaler": state.scaler, "parallelism_config": state.parallelism_config,
                     "auto_microbatching": state.auto_microbatching,
                     "fsdp_config": state.fsdp_config, "fsdp_enabled": state.fsdp_enabled}


def _trainer(**kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    data = make_dataloader(num_batches=2, batch_size=4).dataset
    loader = DataLoader(data, batch_size=4 // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=False))
    return Trainer(model=SimpleModel(), train_dataloader=loader, max_duration="1ba",
                   progress_bar=False, device="cpu", **kwargs)


def test_amp_fp16_scaler_is_on_the_state() -> None:
    reader = ReadsState()
    trainer = _trainer(precision="amp_fp16", callbacks=[reader])
    trainer.fit()
    assert isinstance(reader.seen["scaler"], torch.amp.GradScaler)
    assert trainer.state.scaler is reader.seen["scaler"] is trainer.grad_scaler
    trainer.close()


def test_fp32_has_no_scaler_and_fit_precision_sets_one() -> None:
    trainer = _trainer()
    assert trainer.state.scaler is None
    trainer.fit(precision="amp_fp16", duration="1ba")
    assert isinstance(trainer.state.scaler, torch.amp.GradScaler)
    trainer.close()


def test_parallelism_config_and_dims_are_on_the_state() -> None:
    reader = ReadsState()
    trainer = _trainer(callbacks=[reader], device_train_microbatch_size="auto")
    trainer.fit()
    config = reader.seen["parallelism_config"]
    assert isinstance(config, ParallelismConfig) and config.fsdp is None
    assert trainer.state.parallelism_config is trainer.parallelism_config is config
    assert reader.seen["auto_microbatching"] is True and trainer.state.auto_microbatching
    assert reader.seen["fsdp_config"] is None and reader.seen["fsdp_enabled"] is False
    dims = trainer.state.parallel_dims
    assert isinstance(dims, ParallelDims) and (dims.dp_size, dims.dp_rank, dims.tp) == (1, 0, 1)
    assert trainer.state.device_mesh is None and not trainer.state.is_model_ddp
    trainer.close()


def test_degrees_that_do_not_fit_are_refused_before_init() -> None:
    """A tp degree that does not divide the world is named before any event fires."""
    class Fired(Callback):
        events: list[str] = []

        def run_event(self, event: Any, state: State, logger: Logger) -> None:
            self.events.append(str(event))

    with pytest.raises(ValueError, match="tensor_parallel_degree=2 does not divide"):
        _trainer(parallelism_config={"tp": {"tensor_parallel_degree": 2}}, callbacks=[Fired()])
    assert Fired.events == []


@pytest.mark.world_size(2)
def test_fsdp_state_and_composer_save_checkpoint_agree(tmp_path: Path) -> None:
    """On 2 FSDP ranks the state carries the fsdp config and the mesh, and Composer's
    ``save_checkpoint(trainer.state)`` writes the format ``Trainer.save_checkpoint`` writes."""
    os.chdir(tmp_path)  # a save without save_folder writes its pointer in the working dir
    trainer = _trainer(parallelism_config={"fsdp": {}})
    trainer.fit()
    state = trainer.state
    assert isinstance(state.fsdp_config, FSDPConfig) and state.fsdp_enabled
    assert state.fsdp_state_dict_type == "sharded" and state.fsdp_sharded_state_dict_enabled
    assert state.device_mesh is not None and tuple(state.device_mesh.shape) == (2,)
    assert (state.parallel_dims.dp_size, state.parallel_dims.dp_shard) == (2, 2)
    assert checkpoint_format(state) == "sharded"
    by_trainer = Path(trainer.save_checkpoint(str(tmp_path / "trainer-ba{batch}")))
    by_utils = Path(save_checkpoint(state, str(tmp_path / "utils-ba{batch}")))
    assert by_trainer.is_dir() and by_utils.is_dir()
    assert sorted(p.name for p in by_trainer.iterdir()) == sorted(
        p.name for p in by_utils.iterdir())
    trainer.close()


def test_composers_metric_value_attributes_are_filled() -> None:
    """Composer's ``train_metric_values``, ``eval_metric_values`` and ``total_loss_dict``."""
    from tests.common.models import SimpleModel as Model

    torch.manual_seed(0)
    trainer = Trainer(model=Model(), train_dataloader=make_dataloader(num_batches=2),
                      eval_dataloader=make_dataloader(num_batches=1), max_duration="2ba",
                      eval_interval="2ba", log_interval="1ba", progress_bar=False, device="cpu")
    trainer.fit()
    state = trainer.state
    assert set(state.total_loss_dict) == {"loss/train/total"}
    assert torch.isfinite(torch.as_tensor(state.total_loss_dict["loss/train/total"]))
    assert set(state.train_metric_values) == set(state.train_metrics)
    assert set(state.eval_metric_values) == set(state.eval_metrics["eval"]) != set()
    assert all(isinstance(v, float) for v in state.eval_metric_values.values())
    assert state.deepspeed_config is None and not state.deepspeed_enabled
    trainer.close()
