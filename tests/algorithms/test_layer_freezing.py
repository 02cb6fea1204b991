"""LayerFreezing: the first fraction of the leaf layers is frozen on FreezeOut's linear
schedule, frozen weights stop changing (the optimizer skips them), the head and its tied
embedding keep training, the frozen depth survives a resume exactly, and it runs on 2 FSDP2
ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Callback, State
from cadence.algorithms import LayerFreezing, freeze_layers
from cadence.parallel import unwrap_model
from tests.algorithms.algorithm_helpers import full, run_trainer, tiny_gpt

LEAVES = 25  # the tiny GPT's leaf modules: 24 that may freeze, then lm_head


def _frozen(model: Any) -> set[str]:
    return {n for n, p in unwrap_model(model).named_parameters() if not p.requires_grad}


def test_freeze_layers_freezes_the_first_fraction() -> None:
    model = tiny_gpt()
    assert freeze_layers(model, None, current_duration=0.5) == (0, 0.0)
    assert not _frozen(model)
    depth, fraction = freeze_layers(model, None, current_duration=0.75)  # half of the span
    assert (depth, fraction) == (12, 0.5)  # int(0.5 * 24): wte ... h.0.mlp.dropout
    assert _frozen(model) == {
        "model.transformer.wpe.weight", "model.transformer.h.0.ln_1.weight",
        "model.transformer.h.0.ln_1.bias", "model.transformer.h.0.attn.c_attn.weight",
        "model.transformer.h.0.attn.c_attn.bias", "model.transformer.h.0.attn.c_proj.weight",
        "model.transformer.h.0.attn.c_proj.bias", "model.transformer.h.0.ln_2.weight",
        "model.transformer.h.0.ln_2.bias", "model.transformer.h.0.mlp.c_fc.weight",
        "model.transformer.h.0.mlp.c_fc.bias", "model.transformer.h.0.mlp.c_proj.weight",
        "model.transformer.h.0.mlp.c_proj.bias"}  # wte is tied to the head: still trained
    # all the way: everything but the head (and its tied embedding)
    assert freeze_layers(model, None, 1.0, freeze_start=0.5, freeze_level=1.0)[0] == 24
    assert "model.transformer.ln_f.weight" in _frozen(model)
    assert unwrap_model(model).model.lm_head.weight.requires_grad
    # freeze_level scales the final fraction
    assert freeze_layers(tiny_gpt(), None, 1.0, freeze_start=0.0, freeze_level=0.25)[0] == 6


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="freeze_start"):
        LayerFreezing(freeze_start=1.0)
    with pytest.raises(ValueError, match="freeze_level"):
        freeze_layers(tiny_gpt(), None, 0.5, freeze_level=2.0)


class Snapshots(Callback):
    """The (full) weights and the frozen names at each EPOCH_END, and each step's loss."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []
        self.frozen: list[set[str]] = []
        self.losses: list[float] = []

    def batch_end(self, state: State, logger: Any) -> None:
        self.losses.append(float(state.total_loss))

    def epoch_end(self, state: State, logger: Any) -> None:
        self.frozen.append(_frozen(state.model))
        self.weights.append({n: full(p).clone()
                             for n, p in unwrap_model(state.model).named_parameters()})


def _run(**kwargs: Any) -> Any:
    # 3 epochs of 4 batches; freezing from the start: 8 layers after epoch 1, 16 after 2
    return run_trainer(tiny_gpt(), [LayerFreezing(freeze_start=0.0)], steps=12, **kwargs)


def test_trainer_freezes_on_schedule_and_frozen_weights_stop_changing() -> None:
    snaps = Snapshots()
    trainer = _run(callbacks=[snaps])
    algorithm = trainer.state.algorithms[0]
    assert algorithm.freeze_depth == 24 and len(snaps.frozen) == 3
    first, second = snaps.frozen[0], snaps.frozen[1]
    assert first < second and "model.transformer.wpe.weight" in first
    assert "model.transformer.h.1.attn.c_attn.weight" in second - first
    for name in first:  # frozen after epoch 1: unchanged by the 8 later steps (AdamW decays)
        assert torch.equal(snaps.weights[0][name], snaps.weights[2][name]), name
    head = "model.transformer.wte.weight"  # tied to lm_head: listed once, under wte
    assert not torch.equal(snaps.weights[1][head], snaps.weights[2][head])
    assert snaps.losses[-1] < snaps.losses[0] - 0.5


def test_resume_after_freezing_is_exact(tmp_path: Path) -> None:
    straight = _run(save_folder=str(tmp_path), run_name="lf", save_interval="1ep")
    path = next(tmp_path.glob("ep1-ba4*.pt"))  # the checkpoint after epoch 1: 8 frozen
    resumed = _run(load_path=str(path), save_folder=str(tmp_path), run_name="lf",
                   save_overwrite=True, fit=False)
    algorithm = resumed.state.algorithms[0]
    assert algorithm.state_dict() == {"freeze_depth": 8}
    assert "model.transformer.wpe.weight" in _frozen(resumed.state.model)
    resumed.fit()
    assert algorithm.freeze_depth == 24
    for (name, a), b in zip(straight.state.model.named_parameters(),
                            resumed.state.model.parameters()):
        assert torch.equal(a, b), name


@pytest.fixture(scope="module")
def single_process_weights() -> dict[str, torch.Tensor]:
    trainer = _run()
    return {n: p.detach().clone() for n, p in trainer.state.model.named_parameters()}


@pytest.mark.slow
@pytest.mark.world_size(2)
def test_fsdp_two_ranks(single_process_weights: dict[str, torch.Tensor]) -> None:
    from torch.distributed.tensor import DTensor

    snaps = Snapshots()
    trainer = _run(callbacks=[snaps], parallelism_config={"fsdp": {}})
    params = dict(trainer.state.model.named_parameters())
    assert all(isinstance(p, DTensor) for p in params.values())
    for name in sorted(snaps.frozen[0]):  # the same order (of collectives) on every rank
        assert torch.equal(snaps.weights[0][name], full(params[name])), name
    for name, param in params.items():
        # 12 AdamW steps amplify reduction-order differences of near-zero gradients
        torch.testing.assert_close(full(param), single_process_weights[name], rtol=1e-3,
                                   atol=5e-4)
