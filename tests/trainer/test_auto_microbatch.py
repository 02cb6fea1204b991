"""device_train_microbatch_size='auto' with a simulated out-of-memory error (CPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from cadence import Callback, State, Trainer
from cadence.config.load import load_config
from tests.common.models import SimpleModel, make_dataloader


class OOMAbove(SimpleModel):
    """Raises torch.OutOfMemoryError for a microbatch of more than ``limit`` samples."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.sizes: list[int] = []

    def forward(self, batch: Any) -> torch.Tensor:
        self.sizes.append(len(batch[0]))
        if len(batch[0]) > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return super().forward(batch)


class Grads(Callback):
    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []

    def after_train_batch(self, state: State, logger: Any) -> None:
        self.grads.append({n: p.grad.clone() for n, p in state.model.named_parameters()})


def run(model: SimpleModel, microbatch: Any) -> tuple[Trainer, Grads]:
    grads = Grads()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=3, batch_size=8),
                      max_duration="3ba", device_train_microbatch_size=microbatch,
                      optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      callbacks=[grads], progress_bar=False, seed=0)
    trainer.fit()
    return trainer, grads


def test_size_halves_until_it_fits_and_gradients_match_full_batch(
        caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    oom = OOMAbove(limit=3)
    torch.manual_seed(0)
    reference = SimpleModel()
    with caplog.at_level("INFO"):
        trainer, grads = run(oom, "auto")
    assert trainer.state.device_train_microbatch_size == 2  # 8 -> 4 -> 2
    assert oom.sizes[:3] == [8, 4, 2]  # two failed attempts, then 4 microbatches of 2
    assert trainer.state.timestamp.batch == 3
    assert "the whole batch (8) is used" in caplog.text
    assert "a microbatch of 8 ran out of memory; now 4" in caplog.text
    _, full = run(reference, None)
    for step in range(3):
        for name, grad in full.grads[step].items():
            torch.testing.assert_close(grads.grads[step][name], grad, rtol=0, atol=1e-6)


def test_oom_without_auto_is_raised() -> None:
    with pytest.raises(torch.OutOfMemoryError):
        run(OOMAbove(limit=3), None)


def test_oom_at_one_sample_gives_up_with_a_message() -> None:
    with pytest.raises(RuntimeError, match="A microbatch of 1 sample ran out of memory"):
        run(OOMAbove(limit=0), "auto")


def test_config_accepts_auto_and_rejects_other_strings() -> None:
    base = {"max_duration": "1ba", "global_train_batch_size": 4, "model": {"name": "gpt2"},
            "train_loader": {"name": "shakespeare"}}
    assert load_config({**base, "device_train_microbatch_size": "auto"}) \
        .device_train_microbatch_size == "auto"
    with pytest.raises(ValueError, match="must be a positive int, 'auto' or null"):
        load_config({**base, "device_train_microbatch_size": "big"})


@pytest.mark.world_size(2)
def test_auto_microbatching_under_fsdp2_two_ranks() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from cadence import dist
    from cadence.parallel.grad_norm import get_grad_norm

    class Norms(Callback):
        def __init__(self) -> None:
            self.values: list[float] = []

        def after_train_batch(self, state: State, logger: Any) -> None:
            self.values.append(float(get_grad_norm(state.model.parameters())))

    def train(microbatch: Any) -> tuple[Trainer, Norms]:
        torch.manual_seed(0)
        model = OOMAbove(limit=2)
        x, y = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.arange(32) % 3
        data = TensorDataset(x, y)
        loader = DataLoader(data, batch_size=8, sampler=dist.get_sampler(data, shuffle=False))
        norms = Norms()
        trainer = Trainer(model=model, train_dataloader=loader, max_duration="2ba",
                          device_train_microbatch_size=microbatch, callbacks=[norms],
                          optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                          parallelism_config={"fsdp": {}}, progress_bar=False, seed=0)
        trainer.fit()
        return trainer, norms

    trainer, auto = train("auto")
    assert trainer.state.device_train_microbatch_size == 2  # 8 -> 4 -> 2 on both ranks
    _, fixed = train(2)
    assert auto.values == pytest.approx(fixed.values, rel=1e-6)
