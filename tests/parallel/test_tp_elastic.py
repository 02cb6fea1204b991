"""Elastic resume across meshes: a sharded (DCP) checkpoint from a 2 x 2 (fsdp x tp) run
continues on 2 ranks FSDP-only, on 2 ranks TP=2 and on one process; a TP=2 checkpoint on
one process; an FSDP-only checkpoint on a TP=2 run. Each continues the uninterrupted
run's loss curve. A layout that cannot load is refused before anything is read, naming
the checkpoint's layout, this run's and the fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest

from torch.distributed.tensor import DTensor

from cadence import Trainer, dist
from tests.common.distributed import run_in_processes
from tests.parallel.test_tp import FSDP_X_TP, TP2, make_trainer

FSDP = {"fsdp": {}}
SAVE_STEPS = 4  # the saving runs: checkpoints at steps 2 and 4
# fp32. DCP reshards the same global tensors (model and AdamW state); what differs after a
# change of layout is the order of the sums (row-parallel all-reduce, FSDP reduce-scatter),
# ~1e-7 relative per step on a loss ~4.
RELATIVE_TOLERANCE = 1e-5


def _losses(memory: Any) -> list[float]:
    return [float(v) for _, v in memory.data["loss/train/total"]]


def _save_run(folder: str, config: dict[str, Any], name: str) -> None:
    """Train ``SAVE_STEPS`` steps on ``config`` writing sharded checkpoints every 2 steps;
    rank 0 writes the losses to ``folder/{name}.json``."""
    trainer, memory = make_trainer(config, steps=SAVE_STEPS, save_folder=f"{folder}/{name}",
                                   save_interval="2ba", run_name=name,
                                   save_state_dict_type="sharded")
    trainer.fit()
    trainer.close()
    if dist.get_global_rank() == 0:
        Path(folder, f"{name}.json").write_text(json.dumps(_losses(memory)))
    dist.barrier()


def _save_2x2(folder: str) -> None:
    _save_run(folder, FSDP_X_TP, "run-2x2")


def _save_tp2(folder: str) -> None:
    _save_run(folder, TP2, "run-tp2")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A 2 x 2 run on 4 ranks and a TP=2 run on 2 ranks, each with a sharded checkpoint
    at step 2 and its uninterrupted losses for steps 1-4."""
    folder = tmp_path_factory.mktemp("elastic")
    run_in_processes(4, __file__, "_save_2x2", {"folder": str(folder)}, timeout=120)
    run_in_processes(2, __file__, "_save_tp2", {"folder": str(folder)}, timeout=120)
    out: dict[str, Any] = {}
    for name in ("run-2x2", "run-tp2"):
        step2 = sorted((folder / name).glob("*ba2*"))
        assert len(step2) == 1 and step2[0].is_dir(), sorted((folder / name).iterdir())
        out[name] = {"step2": str(step2[0]),
                     "losses": json.loads((folder / f"{name}.json").read_text())}
    return out


def _resume(path: str, config: Optional[dict[str, Any]]) -> list[float]:
    """Steps 3 and 4 of a run on ``config`` resumed from ``path``."""
    trainer, memory = make_trainer(config, steps=SAVE_STEPS, load_path=path)
    assert int(trainer.state.timestamp.batch) == 2
    trainer.fit()
    trainer.close()
    return _losses(memory)


def _check(what: str, losses: list[float], expected: list[float]) -> None:
    assert len(losses) == len(expected) == 2, (what, losses)
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, expected))
    if dist.get_global_rank() == 0:
        print(f"max relative loss diff {what}: {worst:.2e}", flush=True)
    assert worst <= RELATIVE_TOLERANCE, f"{what}: resumed {losses} != uninterrupted {expected}"


@pytest.mark.world_size(2)
def test_resume_on_two_ranks_with_another_mesh(saved: dict[str, Any], tmp_path: Path) -> None:
    """2 x 2 -> FSDP-only (dp_shard=2) and -> TP=2 on 2 ranks; FSDP-only -> TP=2."""
    run = saved["run-2x2"]
    expected = run["losses"][2:4]
    _check("2x2 -> fsdp 2", _resume(run["step2"], FSDP), expected)
    _check("2x2 -> tp 2", _resume(run["step2"], TP2), expected)

    _check_refused_with_another_global_batch(run["step2"])

    folder = str(tmp_path)  # the parent's tmp_path: the same folder on both ranks
    trainer, memory = make_trainer(FSDP, steps=SAVE_STEPS, save_folder=folder,
                                   save_interval="2ba", run_name="run-fsdp")
    trainer.fit()
    trainer.close()
    straight = _losses(memory)
    step2 = sorted(Path(folder).glob("*ba2*"))
    assert len(step2) == 1 and step2[0].is_dir()
    _check("fsdp 2 -> tp 2", _resume(str(step2[0]), TP2), straight[2:4])


def _check_refused_with_another_global_batch(path: str) -> None:
    """FSDP-only on 2 ranks with the 2 x 2 run's per-rank batch of 4 doubled to 8 (a
    global batch of 16, the checkpoint's is 8): refused at construction, before loading,
    naming both layouts and the per-rank batch size that resumes."""
    import torch
    from torch.utils.data import DataLoader

    from tests.parallel.test_tp import parity_tokens, tiny_gpt2

    model = tiny_gpt2()
    before = [p.detach().clone() for p in model.parameters()]
    dataset = parity_tokens()
    loader = DataLoader(dataset, batch_size=8, sampler=dist.get_sampler(dataset, shuffle=False))
    with pytest.raises(ValueError) as info:
        Trainer(model=model, train_dataloader=loader, max_duration="4ba", load_path=path,
                optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2), progress_bar=False,
                parallelism_config=FSDP, device="cpu")
    message = str(info.value)
    assert "written by 4 rank(s) (dp_replicate=1, dp_shard=2, tp=2) with a global batch of " \
           "8 samples; this run has 2 rank(s) (dp_replicate=1, dp_shard=2, tp=1) and a global " \
           "batch of 16 (8 per rank x 2 data-parallel ranks)" in message, message
    assert "set the train loader's per-rank batch_size to 4" in message
    assert "load_weights_only=True, or `cadence convert --to full`" in message
    # nothing was loaded: the (now sharded) parameters still hold their initial values
    after = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
    assert all(torch.equal(a.detach(), b) for a, b in zip(after, before))


def test_resume_on_one_process(saved: dict[str, Any]) -> None:
    """2 x 2 -> one process, TP=2 -> one process."""
    for name in ("run-2x2", "run-tp2"):
        run = saved[name]
        _check(f"{name} -> 1 process", _resume(run["step2"], None), run["losses"][2:4])


def test_global_batch_check_allows_a_partial_last_batch(tmp_path: Path) -> None:
    """The check on a written timestamp: full batches of this run's global batch and a
    partial last batch of the epoch pass; another global batch mid-epoch is refused, and a
    checkpoint without a recorded mesh is named by its world size."""
    import types

    import torch
    from torch.utils.data import DataLoader

    from cadence.core.time import Timestamp
    from cadence.parallel.config import parse_parallelism_config
    from cadence.parallel.elastic import check_resume_layout

    def checkpoint(batches: int, samples: int) -> Path:
        timestamp = Timestamp().state_dict()
        timestamp.update(batch_in_epoch=batches, sample_in_epoch=samples, batch=batches,
                         sample=samples)
        path = tmp_path / f"ba{batches}-sp{samples}.pt"
        torch.save({"timestamp": timestamp, "metadata": {"world_size": 3}}, path)
        return path

    config = parse_parallelism_config(None)
    state = types.SimpleNamespace(train_dataloader=DataLoader(list(range(10)), batch_size=4))
    check_resume_layout(checkpoint(2, 8), state, config)  # two full batches of 4
    check_resume_layout(checkpoint(3, 10), state, config)  # 4 + 4 + the last 2
    with pytest.raises(ValueError) as info:
        check_resume_layout(checkpoint(2, 6), state, config)  # batches of 3
    message = str(info.value)
    assert "after batch 2 of epoch 0" in message
    assert "written by 3 rank(s) (mesh not recorded) with a global batch of 3 samples; this " \
           "run has 1 rank(s) (dp_replicate=1, dp_shard=1, tp=1) and a global batch of 4" \
           in message, message
    assert "set the train loader's per-rank batch_size to 3" in message
    check_resume_layout(checkpoint(2, 6), state, config, ignore_keys=["timestamp"])
