"""Resume with optimizers whose state holds no tensors (SGD without momentum) as well as
ones that do (SGD with momentum): save -> load -> continued training is bit-exact, for
``full`` and ``sharded`` checkpoints, in one process and on two FSDP ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader

from cadence import Trainer, dist
from cadence.loggers import InMemoryLogger
from tests.common.models import SimpleModel, make_dataloader

TOTAL = "6ba"
STOP = 3


def _train(folder: Path, momentum: float, fmt: str, fsdp: bool, max_duration: str,
           load_path: Optional[str] = None) -> tuple[dict[int, float], dict[str, torch.Tensor]]:
    """Train SimpleModel with SGD; the logged loss by step and the final (full) weights."""
    torch.manual_seed(0)
    model = SimpleModel()
    data = make_dataloader(num_batches=8, batch_size=4).dataset
    loader = DataLoader(data, batch_size=4 // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=False))
    trainer = Trainer(
        model=model, train_dataloader=loader,
        max_duration=max_duration, seed=5, run_name="sgd", save_folder=str(folder),
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum),
        save_interval=f"{STOP}ba", save_state_dict_type=fmt, load_path=load_path,
        loggers=[memory := InMemoryLogger()], log_interval="1ba", progress_bar=False,
        parallelism_config={"fsdp": {"state_dict_type": fmt}} if fsdp else None,
    )
    trainer.fit()
    weights = get_model_state_dict(trainer.state.model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    trainer.close()
    return dict(zip(*memory.steps_and_values("loss/train/total"))), weights


def check_resume(tmp_path: Path, momentum: float, fmt: str, fsdp: bool = False) -> None:
    straight, final = _train(tmp_path / "straight", momentum, fmt, fsdp, TOTAL)
    _train(tmp_path / "first", momentum, fmt, fsdp, f"{STOP}ba")
    checkpoint = tmp_path / "first" / (f"ep0-ba{STOP}" + ("-rank0.pt" if fmt == "full" else ""))
    resumed, resumed_final = _train(tmp_path / "resumed", momentum, fmt, fsdp, TOTAL,
                                    load_path=str(checkpoint))
    assert sorted(resumed) == list(range(STOP + 1, 7))
    for step, loss in resumed.items():
        assert loss == straight[step], f"step {step}: {loss!r} != {straight[step]!r}"
    for name, tensor in final.items():
        if dist.get_global_rank() == 0:  # full state dicts live on rank 0
            assert torch.equal(resumed_final[name], tensor), name


@pytest.mark.parametrize("fmt", ["full", "sharded"])
@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["no_momentum", "momentum"])
def test_sgd_resume_bit_exact(tmp_path: Path, momentum: float, fmt: str) -> None:
    check_resume(tmp_path, momentum, fmt)


@pytest.mark.world_size(2)
@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_sgd_without_momentum_resume_fsdp_two_ranks(tmp_path: Path, fmt: str) -> None:
    check_resume(tmp_path, 0.0, fmt, fsdp=True)
