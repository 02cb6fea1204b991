"""Metrics under tensor parallelism: the ranks of one tensor-parallel group see the same
samples, so metrics sync over the data-parallel ranks only and count each sample once
(sums, not just averages): TP=2 on 2 ranks, and FSDP2 x TP (2 x 2) on 4 ranks. The
metrics' group times out after the run's ``dist_timeout``."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

from cadence import Trainer, dist
from cadence.loggers import InMemoryLogger
from tests.common.models import SimpleModel
from tests.checkpoint.test_async_timeout import group_timeout

EVAL_SAMPLES = 7  # odd: with 2 data-parallel ranks (2 x 2), one gets a padded copy
TRAIN_BATCH = 4  # global; each data-parallel rank loads its share


class CountingModel(SimpleModel):
    """SimpleModel, tensor-parallel (``net.0`` colwise, ``net.2`` rowwise), whose metric
    counts samples (a ``SumMetric`` of batch sizes)."""

    def tp_plan(self) -> dict[str, str]:
        return {"net.0": "colwise", "net.2": "rowwise"}

    def get_metrics(self, is_train: bool = False) -> dict[str, Any]:
        return {"Samples": torchmetrics.SumMetric()}

    def update_metric(self, batch: Any, outputs: Any, metric: Any) -> None:
        metric.update(torch.tensor(float(len(batch[1]))))


def _loader(samples: int, global_batch: int, seed: int) -> DataLoader:
    gen = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(samples, 8, generator=gen),
                         torch.randint(0, 3, (samples,), generator=gen))
    # per data-parallel rank: the global batch over the world / tensor_parallel_degree ranks
    return DataLoader(data, batch_size=global_batch * 2 // dist.get_world_size(),
                      sampler=dist.get_sampler(data, shuffle=False))


def check_counts(parallelism_config: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = CountingModel()
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=_loader(8, TRAIN_BATCH, 0),
                      eval_dataloader=_loader(EVAL_SAMPLES, 2, 1), max_duration="2ba",
                      eval_interval="2ba", loggers=[memory], log_interval="1ba",
                      progress_bar=False, parallelism_config=parallelism_config, device="cpu",
                      dist_timeout=45)
    trainer.fit()
    counted = float(trainer.state.eval_metrics["eval"]["Samples"].compute())
    assert counted == EVAL_SAMPLES, f"{counted} samples counted, {EVAL_SAMPLES} evaluated"
    assert [float(v) for _, v in memory.data["metrics/eval/Samples"]] == [EVAL_SAMPLES]
    assert [float(v) for _, v in memory.data["metrics/train/Samples"]] == [TRAIN_BATCH] * 2
    group = trainer._metric_group  # this rank's data-parallel peers
    assert group is not None and group.size() == dist.get_world_size() // 2
    assert group_timeout(group) == datetime.timedelta(seconds=45)
    trainer.close()


@pytest.mark.world_size(2)
def test_tp2_metrics_count_each_sample_once() -> None:
    check_counts({"tp": {"tensor_parallel_degree": 2}})


@pytest.mark.world_size(4)
def test_fsdp_x_tp_metrics_count_each_sample_once() -> None:
    check_counts({"fsdp": {}, "tp": {"tensor_parallel_degree": 2}})


@pytest.mark.world_size(2)
def test_tp2_eval_dataloader_given_to_fit_counts_each_sample_once() -> None:
    """``fit(eval_dataloader=)`` splits its sampler over the data-parallel ranks too (the
    tensor-parallel pair evaluates the same samples), as ``Trainer(eval_dataloader=)`` does."""
    torch.manual_seed(0)
    trainer = Trainer(model=CountingModel(), train_dataloader=_loader(8, TRAIN_BATCH, 0),
                      max_duration="2ba", progress_bar=False, device="cpu",
                      parallelism_config={"tp": {"tensor_parallel_degree": 2}})
    loader = _loader(EVAL_SAMPLES, 2, 1)
    trainer.fit(eval_dataloader=loader, eval_interval="2ba")
    assert loader.sampler.num_replicas == 1 and loader.sampler.rank == 0
    counted = float(trainer.state.eval_metrics["eval"]["Samples"].compute())
    assert counted == EVAL_SAMPLES, f"{counted} samples counted, {EVAL_SAMPLES} evaluated"
    trainer.close()
