"""Single process, DDP and FSDP2 (every sharding strategy) give the same loss curve for the
same global batch, and FULL_SHARD halves each rank's parameter + gradient + optimizer bytes."""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Callback, State, Trainer, dist
from cadence.models.gpt import gpt2
from cadence.loggers import InMemoryLogger
from cadence.parallel.grad_norm import get_grad_norm
from cadence.parallel.memory import local_state_bytes
from tests.algorithms.algorithm_helpers import CountingTokens

STEPS = 10
GLOBAL_BATCH = 8
SEQ = 16
VOCAB = 64
# fp32; the only differences are the order of floating-point sums in the gradient
# reductions (all-reduce / reduce-scatter vs one process), amplified a little by AdamW.
TOLERANCE = 2e-6  # measured: 4.8e-7 for every strategy (loss ~4, so a few ulps)


def parity_tokens() -> CountingTokens:
    """The ``STEPS * GLOBAL_BATCH`` counting sequences (``[SEQ]``, vocabulary ``VOCAB``) the
    parity, tensor-parallel and materialisation tests train on."""
    return CountingTokens(STEPS * GLOBAL_BATCH, seq_len=SEQ, vocab_size=VOCAB)


def train_losses(parallelism_config: Optional[dict[str, Any]]) -> tuple[list[float], Trainer]:
    """Train the tiny GPT for STEPS steps of GLOBAL_BATCH samples; the logged (all-ranks
    mean) loss of each step."""
    torch.manual_seed(0)
    model = gpt2(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, max_seq_len=SEQ)
    dataset = parity_tokens()
    world = dist.get_world_size()
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world,
                        sampler=dist.get_sampler(dataset, shuffle=False))
    memory = InMemoryLogger()
    grad_norms = GradNorms()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration=f"{STEPS}ba",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      parallelism_config=parallelism_config, device="cpu",
                      callbacks=[grad_norms])
    trainer.fit()
    losses = [value for _, value in memory.data["loss/train/total"]]
    assert len(losses) == STEPS
    trainer.grad_norms = grad_norms.values  # type: ignore[attr-defined]
    return losses, trainer


class GradNorms(Callback):
    """The total gradient norm of each step (gradients final, before the optimizer)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def after_train_batch(self, state: State, logger: Any) -> None:
        self.values.append(float(get_grad_norm(state.model.parameters())))


def local_bytes(trainer: Trainer) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state (local shards only)."""
    return local_state_bytes(trainer.state.model, trainer.state.optimizer)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The single-process loss curve and byte counts (computed once, in this process)."""
    losses, trainer = train_losses(None)
    assert losses[-1] < losses[0]  # it learns
    return {"losses": losses, "bytes": local_bytes(trainer),
            "grad_norms": trainer.grad_norms}  # type: ignore[attr-defined]


STRATEGIES = {
    "ddp": None,
    "full_shard": {"fsdp": {"sharding_strategy": "FULL_SHARD"}},
    "shard_grad_op": {"fsdp": {"sharding_strategy": "SHARD_GRAD_OP"}},
    "no_shard": {"fsdp": {"sharding_strategy": "NO_SHARD"}},
    "hybrid_2x1": {"fsdp": {"sharding_strategy": "HYBRID_SHARD",
                            "data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 1}},
    "hybrid_1x2": {"fsdp": {"sharding_strategy": "HYBRID_SHARD",
                            "data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 2}},
    "hybrid_zero2_1x2": {"fsdp": {"sharding_strategy": "HYBRID_SHARD_ZERO2",
                                  "data_parallel_shard_degree": 2}},
}


@pytest.mark.world_size(2)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_same_loss_curve_as_single_process(reference: dict[str, Any], strategy: str) -> None:
    losses, trainer = train_losses(STRATEGIES[strategy])
    expected = reference["losses"]
    worst = max(abs(a - b) for a, b in zip(losses, expected))
    assert worst <= TOLERANCE, f"{strategy}: max |loss diff| {worst:.2e} > {TOLERANCE}"
    # the gradient-norm helper sees the global gradient (DTensor shards reduced over the mesh)
    norms = trainer.grad_norms  # type: ignore[attr-defined]
    assert norms == pytest.approx(reference["grad_norms"], rel=1e-4)
    if strategy == "ddp":
        assert isinstance(trainer.state.model, torch.nn.parallel.DistributedDataParallel)
    else:
        from torch.distributed.fsdp import FSDPModule

        assert isinstance(trainer.state.model, FSDPModule)


@pytest.mark.world_size(2)
def test_full_shard_halves_each_ranks_bytes(reference: dict[str, Any]) -> None:
    _, trainer = train_losses(STRATEGIES["full_shard"])
    mine, single = local_bytes(trainer), reference["bytes"]
    for kind in ("params", "grads", "optimizer"):
        ratio = mine[kind] / single[kind]
        # dim-0 shards are padded to a multiple of the world size, so a little over half
        assert 0.45 <= ratio <= 0.56, f"{kind}: rank {dist.get_global_rank()} holds {ratio:.3f}"


@pytest.mark.world_size(2)
def test_dist_helpers_inside_a_callback(tmp_path: Any) -> None:
    seen: dict[str, Any] = {}

    class Collect(Callback):
        def fit_start(self, state: State, logger: Any) -> None:
            seen["ranks"] = dist.all_gather_object(dist.get_global_rank())
            total = torch.tensor([float(dist.get_global_rank() + 1)])
            dist.all_reduce(total, "sum")
            seen["sum"] = float(total)
            box = [state.run_name if dist.get_global_rank() == 0 else None]
            dist.broadcast_object_list(box)
            seen["name"] = box[0]

    @dist.rank_zero_only
    def write_once() -> None:
        with open(tmp_path / "rank_zero.txt", "a") as f:
            f.write(f"rank {dist.get_global_rank()}\n")

    _, trainer = train_losses(None)
    Collect().fit_start(trainer.state, None)
    write_once()
    dist.barrier()
    assert seen == {"ranks": [0, 1], "sum": 3.0, "name": trainer.state.run_name}
    assert (tmp_path / "rank_zero.txt").read_text() == "rank 0\n"
