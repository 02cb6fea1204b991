"""``parallelism_config.fsdp.sync_gradients``: collectives per optimizer step with 4
microbatches on 2 ranks, counted by wrapping ``torch.distributed``'s collectives, and equal
gradients either way."""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Callback, State, Trainer, dist
from tests.trainer.test_token_weighting import PaddedSequences, tiny_lm

MICROBATCHES = 4


class StepCollectives(Callback):
    """Counts FSDP2's collectives between BEFORE_TRAIN_BATCH and AFTER_TRAIN_BATCH (one
    step's forwards and backwards), by name; copies the final gradients."""

    names = ("reduce_scatter_single", "all_reduce", "all_gather_single")

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.grads: dict[str, torch.Tensor] = {}
        self._real: dict[str, Any] = {}

    def before_train_batch(self, state: State, logger: Any) -> None:
        for name in self.names:
            real = self._real[name] = getattr(torch.distributed, name)

            def counting(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
                tensor = args[0] if args else next(iter(kwargs.values()))
                if tensor.dtype.is_floating_point:  # not the token count (int64)
                    self.counts[_name] += 1
                return _real(*args, **kwargs)

            setattr(torch.distributed, name, counting)

    def after_train_batch(self, state: State, logger: Any) -> None:
        for name, real in self._real.items():
            setattr(torch.distributed, name, real)
        self.grads = {n: p.grad.full_tensor().clone() for n, p in state.model.named_parameters()}


def one_step(fsdp: dict[str, Any]) -> tuple[collections.Counter[str], dict[str, torch.Tensor],
                                             int]:
    from torch.distributed.fsdp import FSDPModule

    model = tiny_lm()
    data = PaddedSequences()
    data.items = data.items * 2  # 8 sequences: 4 per rank, microbatches of 1
    loader = DataLoader(data, batch_size=MICROBATCHES,
                        sampler=dist.get_sampler(data, shuffle=False))
    capture = StepCollectives()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration="1ba",
                      device_train_microbatch_size=1, callbacks=[capture],
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      parallelism_config={"fsdp": fsdp}, progress_bar=False, seed=0,
                      device="cpu")
    trainer.fit()
    units = sum(isinstance(m, FSDPModule) for m in trainer.state.model.modules())
    trainer.close()
    return capture.counts, capture.grads, units


@pytest.mark.world_size(2)
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "HYBRID_SHARD"])
def test_sync_gradients_collectives_and_equal_gradients(strategy: str) -> None:
    fsdp: dict[str, Any] = {"sharding_strategy": strategy}
    if strategy == "HYBRID_SHARD":  # 2 replicas of 1 shard: the all-reduce across replicas
        fsdp.update(data_parallel_replicate_degree=2, data_parallel_shard_degree=1)
    every, every_grads, units = one_step({**fsdp, "sync_gradients": "every_microbatch"})
    last, last_grads, _ = one_step({**fsdp, "sync_gradients": "last_microbatch"})
    if dist.get_global_rank() == 0:
        print(f"\n{strategy}, {units} FSDP units, {MICROBATCHES} microbatches, per step: "
              f"every_microbatch {dict(every)}; last_microbatch {dict(last)}")
    for name in every_grads:
        torch.testing.assert_close(last_grads[name], every_grads[name], rtol=1e-5, atol=1e-7)
    assert every["all_gather_single"] == last["all_gather_single"]  # parameters: unchanged
    if strategy == "FULL_SHARD":
        assert every["reduce_scatter_single"] == MICROBATCHES * units
        assert last["reduce_scatter_single"] == units
        assert every["all_reduce"] == last["all_reduce"] == 0
    else:  # the replicas' all-reduce once per step in both settings
        assert every["all_reduce"] == last["all_reduce"] == units
