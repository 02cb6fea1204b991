"""Each rank sees distinct samples; eval metrics are exact across ranks (the samples a
DistributedSampler repeats to even out the ranks are not counted twice)."""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cadence import Trainer, dist
from tests.common.models import SimpleModel

N_EVAL = 7  # odd: the sampler pads rank 1 with a copy of sample 0


def eval_data() -> TensorDataset:
    gen = torch.Generator().manual_seed(5)
    return TensorDataset(torch.randn(N_EVAL, 8, generator=gen),
                         torch.randint(0, 3, (N_EVAL,), generator=gen))


def make_trainer(parallelism_config: Optional[dict[str, Any]]) -> Trainer:
    torch.manual_seed(0)
    model = SimpleModel()
    data = eval_data()
    loader = DataLoader(data, batch_size=2, sampler=dist.get_sampler(data, shuffle=False))
    return Trainer(model=model, eval_dataloader=loader, progress_bar=False, seed=0,
                   parallelism_config=parallelism_config)


@pytest.fixture(scope="module")
def single_accuracy() -> float:
    torch.manual_seed(0)
    model = SimpleModel()
    x, y = eval_data().tensors
    with torch.no_grad():
        return float((model((x, y)).argmax(-1) == y).float().mean())


@pytest.mark.world_size(2)
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_eval_metrics_are_exact_across_ranks(single_accuracy: float, parallelism: str) -> None:
    config = {"fsdp": {}} if parallelism == "fsdp" else None
    results = make_trainer(config).eval()
    accuracy = results["metrics/eval/MulticlassAccuracy"]
    assert accuracy == pytest.approx(single_accuracy, abs=1e-6)
    assert round(accuracy * N_EVAL) == pytest.approx(accuracy * N_EVAL, abs=1e-4)  # k / 7


@pytest.mark.world_size(2)
def test_map_style_dataset_without_a_distributed_sampler_is_refused() -> None:
    data = eval_data()
    with pytest.raises(ValueError, match=r"cadence\.dist\.get_sampler"):
        Trainer(model=SimpleModel(), train_dataloader=DataLoader(data, batch_size=2),
                max_duration="1ba", progress_bar=False)
    seen = [int(i) for i in dist.get_sampler(data, shuffle=True, seed=3)]
    everyone = dist.all_gather_object(seen)
    # distinct samples, but for the one copy that pads 7 samples to 2 x 4
    assert len(set(everyone[0]) & set(everyone[1])) <= 1 and len(seen) == 4
    assert set(everyone[0]) | set(everyone[1]) == set(range(N_EVAL))
