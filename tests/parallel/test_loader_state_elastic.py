"""A streaming-style train loader resumes on another number of ranks (issue 33, item 3).

mosaicml-streaming's promise: with the same global batch (and ``num_canonical_nodes``
fixed), a checkpoint mid-epoch from N ranks resumes on M ranks and continues the epoch's
sample order, because the dataset's order is global (independent of the number of ranks)
and its state is the number of samples consumed globally. ``GlobalOrderStream`` keeps that
contract (the dataset is split among the ranks one global batch at a time, as streaming's
partition does), so each global batch holds the same samples whatever the number of ranks.

Both ways cadence restores such a state are run (``kind``): a plain ``DataLoader`` over the
dataset (llm-foundry's way: the checkpoint holds ``dataset.state_dict(sample_in_epoch,
True)``) and a loader with its own ``state_dict`` (streaming's ``StreamingDataLoader``). A
run on 2 ranks (4 samples per rank) cut mid-epoch resumes on 1 rank (8 samples), and a run
on 1 rank resumes on 2: every global batch after the resume holds exactly the samples the
uninterrupted run's did, none of the consumed samples is read again and none is skipped,
and the losses are the uninterrupted run's to rounding (the same global mean, summed in
another order). A resume with another global batch mid-epoch is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Callback, State, Trainer, dist
from tests.checkpoint.test_dataloader_resume import SAMPLES
from tests.checkpoint.test_loader_state_resume import EpochStream, Streamingish
from tests.common.distributed import run_in_processes
from tests.common.events import StopAt
from tests.common.models import SimpleModel

GLOBAL_BATCH = 8  # of the 24 samples (SAMPLES) of EpochStream's data
PER_EPOCH = SAMPLES // GLOBAL_BATCH  # 3 global batches
TOTAL = 3 * PER_EPOCH  # 9 batches, 3 epochs
CUT = PER_EPOCH + 2  # after batch 5: two batches into epoch 1
KINDS = ("dataset_state", "loader_state")
#: fp32 losses ~1.1 of the same global batch on 1 and 2 ranks: the same mean, summed in
#: another order (and DDP's gradient average), a few ulps apart per step
LOSS_TOLERANCE = 1e-5


class GlobalOrderStream(EpochStream):
    """Streaming's ``StreamingDataset`` contract, on any number of ranks: each epoch a seeded
    permutation of the samples that does not depend on the number of ranks; rank ``r`` of
    ``W`` takes the ``r``-th ``batch_size`` samples of each global batch of ``W *
    batch_size``; ``len()`` is the per-rank sample count. ``state_dict(num_samples,
    from_beginning)`` counts global samples; after ``load_state_dict`` the next ``iter()``
    continues that epoch after the ``sample_in_epoch`` consumed samples (the next epoch when
    it was over): ``EpochStream``'s position, split among the ranks. ``loaded`` counts the
    samples this rank read."""

    SEED = 70

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.rank, self.world = dist.get_global_rank(), dist.get_world_size()

    def __len__(self) -> int:
        return SAMPLES // self.world

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
        rest = self._epoch_order()
        step = self.batch_size * self.world
        for first in range(0, len(rest), step):
            mine = rest[first:first + step][self.rank * self.batch_size:
                                            (self.rank + 1) * self.batch_size]
            for i in mine:
                self.loaded += 1
                yield self.x[i], self.y[i], i


class GlobalBatches(Callback):
    """Records each global batch: its samples (every rank's, sorted) and the mean of the
    ranks' losses (the global batch's mean loss: the ranks' batches are of one size)."""

    def __init__(self) -> None:
        self.samples: dict[int, list[int]] = {}
        self.losses: dict[int, float] = {}

    def batch_end(self, state: State, logger: Any) -> None:
        assert state.total_loss is not None
        mine = (state.batch[2].tolist(), float(state.total_loss))
        everyone = dist.all_gather_object(mine)
        step = int(state.timestamp.batch)
        self.samples[step] = sorted(i for ids, _ in everyone for i in ids)
        self.losses[step] = sum(loss for _, loss in everyone) / len(everyone)


def _run(folder: str, kind: str, stop_at: Optional[int] = None,
         load_path: Optional[str] = None, global_batch: int = GLOBAL_BATCH) -> dict[str, Any]:
    """Train ``TOTAL`` global batches of ``GLOBAL_BATCH`` on this process group (or stop
    after ``stop_at``, saving a checkpoint there; or resume from ``load_path``). Returns the
    global batches seen, their losses, the samples read on every rank, and the checkpoint's
    data entry kinds."""
    batch_size = global_batch // dist.get_world_size()
    dataset = GlobalOrderStream(batch_size)
    loader = (DataLoader(dataset, batch_size=batch_size) if kind == "dataset_state"
              else Streamingish(dataset, batch_size=batch_size))
    torch.manual_seed(0)
    model = SimpleModel()
    seen = GlobalBatches()
    callbacks: list[Callback] = [seen] + ([StopAt(stop_at)] if stop_at is not None else [])
    trainer = Trainer(
        model=model, train_dataloader=loader, max_duration=f"{TOTAL}ba", seed=11,
        optimizers=torch.optim.SGD(model.parameters(), lr=0.1), callbacks=callbacks,
        progress_bar=False, run_name="elastic", save_folder=folder, save_interval="100ba",
        save_overwrite=True, load_path=load_path)
    resumed_at = int(trainer.state.timestamp.batch)
    trainer.fit()
    trainer.close()
    return {"samples": {str(k): v for k, v in seen.samples.items()},
            "losses": {str(k): v for k, v in seen.losses.items()},
            "loaded": sum(dist.all_gather_object(dataset.loaded)), "resumed_at": resumed_at}


def _checkpoint(folder: str) -> str:
    (path,) = sorted(Path(folder).glob(f"ep*-ba{CUT}-rank0.pt"))
    return str(path)


def _save_json(path: str, value: Any) -> None:
    if dist.get_global_rank() == 0:
        Path(path).write_text(json.dumps(value))
    dist.barrier()


def _two_ranks_first(folder: str) -> None:
    """On 2 ranks, for each kind: the uninterrupted run, and a run cut after ``CUT``."""
    out = {}
    for kind in KINDS:
        out[kind] = {"full": _run(f"{folder}/{kind}/full2", kind),
                     "cut": _run(f"{folder}/{kind}/cut2", kind, stop_at=CUT)}
    _save_json(f"{folder}/two_ranks_first.json", out)


def _two_ranks_resume(folder: str) -> None:
    """On 2 ranks, for each kind: the resume of the 1-rank run cut after ``CUT``."""
    out = {kind: _run(f"{folder}/{kind}/resume2", kind,
                      load_path=_checkpoint(f"{folder}/{kind}/cut1")) for kind in KINDS}
    _save_json(f"{folder}/two_ranks_resume.json", out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every run of both kinds: uninterrupted, cut and resumed, on 1 and 2 ranks."""
    folder = tmp_path_factory.mktemp("loader_state_elastic")
    run_in_processes(2, __file__, "_two_ranks_first", {"folder": str(folder)}, timeout=240)
    one: dict[str, Any] = {}
    for kind in KINDS:
        one[kind] = {"full": _run(f"{folder}/{kind}/full1", kind),
                     "cut": _run(f"{folder}/{kind}/cut1", kind, stop_at=CUT),
                     "resume": _run(f"{folder}/{kind}/resume1", kind,
                                    load_path=_checkpoint(f"{folder}/{kind}/cut2"))}
    run_in_processes(2, __file__, "_two_ranks_resume", {"folder": str(folder)}, timeout=240)
    two = json.loads((folder / "two_ranks_first.json").read_text())
    two_resumed = json.loads((folder / "two_ranks_resume.json").read_text())
    for kind in KINDS:
        two[kind]["resume"] = two_resumed[kind]
    checkpoints = {}
    for kind in KINDS:
        for ranks in (1, 2):
            saved = torch.load(_checkpoint(f"{folder}/{kind}/cut{ranks}"), weights_only=True)
            checkpoints[kind, ranks] = saved["state"]["data"]
    return {"one": one, "two": two, "checkpoints": checkpoints, "folder": folder}


def _check_continues(full: dict[str, Any], cut: dict[str, Any], resumed: dict[str, Any]
                     ) -> None:
    steps = [str(s) for s in range(1, TOTAL + 1)]
    assert list(full["samples"]) == steps
    assert list(cut["samples"]) == steps[:CUT]
    assert resumed["resumed_at"] == CUT and list(resumed["samples"]) == steps[CUT:]
    # the same samples in every global batch, before and after the resume
    assert {**cut["samples"], **resumed["samples"]} == full["samples"]
    # the resumed epoch: every sample once, none read again, none skipped
    epoch = [i for s in steps[PER_EPOCH:2 * PER_EPOCH]
             for i in {**cut["samples"], **resumed["samples"]}[s]]
    assert sorted(epoch) == list(range(SAMPLES))
    assert resumed["loaded"] == (TOTAL - CUT) * GLOBAL_BATCH  # nothing read twice
    for step in steps:
        loss = {**cut["losses"], **resumed["losses"]}[step]
        assert loss == pytest.approx(full["losses"][step], rel=LOSS_TOLERANCE), step


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_two_ranks_resume_on_one(runs: dict[str, Any], kind: str) -> None:
    """Cut on 2 ranks x 4 samples, resumed on 1 rank x 8: the 2-rank run's order goes on."""
    _check_continues(runs["two"][kind]["full"], runs["two"][kind]["cut"],
                     runs["one"][kind]["resume"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_one_rank_resumes_on_two(runs: dict[str, Any], kind: str) -> None:
    """Cut on 1 rank x 8 samples, resumed on 2 ranks x 4: the 1-rank run's order goes on."""
    _check_continues(runs["one"][kind]["full"], runs["one"][kind]["cut"],
                     runs["two"][kind]["resume"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_sample_order_is_the_same_on_one_and_two_ranks(runs: dict[str, Any],
                                                            kind: str) -> None:
    """The premise: uninterrupted, 1 and 2 ranks see the same global batches; each
    checkpoint holds the global count of samples consumed in the epoch."""
    assert runs["one"][kind]["full"]["samples"] == runs["two"][kind]["full"]["samples"]
    for ranks in (1, 2):
        entries = runs["checkpoints"][kind, ranks]
        assert len(entries) == ranks and {e["kind"] for e in entries} == {kind}
        assert entries[0]["state"] == {"epoch": 1,
                                       "sample_in_epoch": (CUT - PER_EPOCH) * GLOBAL_BATCH}


@pytest.mark.slow
def test_another_global_batch_mid_epoch_is_refused(runs: dict[str, Any]) -> None:
    """2 ranks x 4 resumed on 1 rank x 4: the checkpoint's 16 samples of epoch 1 are 2
    global batches of 8, not this run's batches of 4; refused, naming the batch to set."""
    folder = runs["folder"]
    with pytest.raises(ValueError, match="per-rank batch_size to 8"):
        _run(f"{folder}/refused", "dataset_state", global_batch=4,
             load_path=_checkpoint(f"{folder}/dataset_state/cut2"))
