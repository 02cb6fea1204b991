"""A tensor-parallel-only run (one data-parallel group) takes a plain ``DataLoader``: the
ranks of a TP group must see the same samples. With several data-parallel ranks a plain
loader is still refused."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Callback, State, Trainer, dist
from cadence.parallel.data import check_distributed_sampler
from tests.trainer.test_token_weighting import PaddedSequences, tiny_lm


class SeenInputs(Callback):
    def __init__(self) -> None:
        self.seen: list[torch.Tensor] = []

    def after_dataloader(self, state: State, logger: object) -> None:
        self.seen.append(state.batch["input_ids"].clone())


@pytest.mark.world_size(2)
def test_tp_only_run_takes_a_plain_dataloader() -> None:
    seen = SeenInputs()
    loader = DataLoader(PaddedSequences(), batch_size=2)  # no DistributedSampler
    trainer = Trainer(model=tiny_lm(), train_dataloader=loader, max_duration="2ba",
                      callbacks=[seen], parallelism_config={"tp": {"tensor_parallel_degree": 2}},
                      progress_bar=False, seed=0, device="cpu")
    trainer.fit()
    trainer.fit(train_dataloader=DataLoader(PaddedSequences(), batch_size=2), duration="1ba")
    everyone = dist.all_gather_object([t.tolist() for t in seen.seen])
    assert everyone[0] == everyone[1] and len(everyone[0]) == 3  # one TP group: same samples
    trainer.close()


def test_plain_dataloader_refused_with_several_data_parallel_ranks() -> None:
    loader = DataLoader(PaddedSequences(), batch_size=2)
    check_distributed_sampler(loader, "train_dataloader", dp_size=1)
    with pytest.raises(ValueError, match=r"2 data-parallel ranks .*cadence\.dist\.get_sampler"):
        check_distributed_sampler(loader, "train_dataloader", dp_size=2)
