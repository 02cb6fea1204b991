"""ChildTuning: F keeps a reserve_p fraction scaled by 1/reserve_p; D's mask is the fixed
top-reserve_p set of the Fisher estimate, the same on 1 rank and 2 FSDP ranks; the Fisher
pass leaves data order and RNG alone; masks survive checkpoints; resume is exact."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch.utils.data import DataLoader

from cadence import Callback, State, Trainer, dist
from cadence.algorithms import (
    ChildTuning, child_tuning_f_mask_, fisher_information, fisher_mask, top_fraction_threshold,
)
from cadence.checkpoint import save_checkpoint
from cadence.parallel import unwrap_model
from tests.algorithms.algorithm_helpers import (
    CountingTokens, full, local, run_trainer, tiny_gpt,
)

BLOCKS = r"^model\.transformer\.h\."  # the transformer blocks of tiny_gpt


class GradRecorder(Callback):
    """Copies of the (full) gradients at AFTER_TRAIN_BATCH, after the algorithms ran."""

    def __init__(self) -> None:
        self.grads: list[dict[str, torch.Tensor]] = []

    def after_train_batch(self, state: State, logger: Any) -> None:
        module = unwrap_model(state.model)
        self.grads.append({n: full(p.grad).clone() for n, p in module.named_parameters()
                           if p.grad is not None})


def test_f_mask_keeps_reserve_p_and_rescales() -> None:
    grads = [torch.ones(200, 500), torch.ones(1000)]
    generator = torch.Generator().manual_seed(0)
    child_tuning_f_mask_(grads, 0.3, generator)
    values = torch.cat([g.reshape(-1) for g in grads])
    kept = values != 0
    sigma = math.sqrt(0.3 * 0.7 / values.numel())
    assert abs(kept.float().mean().item() - 0.3) < 5 * sigma
    torch.testing.assert_close(values[kept], torch.full_like(values[kept], 1 / 0.3))
    again = [torch.ones(200, 500), torch.ones(1000)]
    child_tuning_f_mask_(again, 0.3, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(grads, again))  # reproducible from the seed


def test_top_fraction_threshold_and_fisher_mask_match_topk() -> None:
    gen = torch.Generator().manual_seed(0)
    fisher = {"a": torch.rand(37, 11, generator=gen), "b": torch.rand(500, generator=gen) ** 3,
              "c": torch.zeros(3)}
    values = torch.cat([f.reshape(-1) for f in fisher.values()])
    for p in (0.1, 0.3, 0.37, 1.0):
        k = math.ceil(p * values.numel())
        expected = torch.topk(values, k).values.min().item()
        assert top_fraction_threshold(fisher.values(), p) == expected
        masks = fisher_mask(fisher, p)
        assert sum(int(m.sum()) for m in masks.values()) == k
        for name, mask in masks.items():
            assert torch.equal(mask, fisher[name] >= expected)
    with pytest.raises(ValueError, match="non-negative"):
        top_fraction_threshold([torch.tensor([1.0, -2.0])], 0.5)


@pytest.mark.parametrize("kwargs, match", [
    ({"reserve_p": 0.0}, "reserve_p"), ({"reserve_p": 1.5}, "reserve_p"),
    ({"mode": "X"}, "mode"), ({"param_regex": "("}, "regular expression"),
    ({"fisher_batches": 0}, "fisher_batches"),
])
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ChildTuning(**kwargs)


def test_regex_selecting_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="selects no"):
        run_trainer(tiny_gpt(), [ChildTuning(param_regex="^nothing$")], fit=False)


def test_default_regex_leaves_embeddings_and_heads_alone() -> None:
    import re

    from cadence.algorithms.child_tuning import DEFAULT_PARAM_REGEX

    selected = [n for n in ("bert.embeddings.word_embeddings.weight",
                            "bert.embeddings.LayerNorm.weight", "bert.pooler.dense.weight",
                            "classifier.weight", "transformer.wte.weight", "lm_head.weight",
                            "score.weight", "bert.encoder.layer.0.output.dense.weight",
                            "transformer.h.0.attn.c_attn.weight", "net.0.weight")
                if re.search(DEFAULT_PARAM_REGEX, n)]
    assert selected == ["bert.encoder.layer.0.output.dense.weight",
                        "transformer.h.0.attn.c_attn.weight", "net.0.weight"]


def test_f_masks_selected_parameters_each_step_afresh() -> None:
    recorder = GradRecorder()
    run_trainer(tiny_gpt(), [ChildTuning(mode="F", reserve_p=0.25, param_regex=BLOCKS)],
                steps=3, callbacks=[recorder])
    plain = GradRecorder()
    run_trainer(tiny_gpt(), [], steps=1, callbacks=[plain])
    zero_sets = []
    for name, grad in recorder.grads[0].items():
        if name.startswith("model.transformer.h."):
            continue
        assert torch.equal(grad, plain.grads[0][name]), name  # unselected: untouched
    for step in recorder.grads:
        blocks = {n: g for n, g in step.items() if n.startswith("model.transformer.h.")}
        values = torch.cat([g.reshape(-1) for g in blocks.values()])
        kept = (values != 0).float().mean().item()
        assert abs(kept - 0.25) < 0.02, kept
        zero_sets.append(torch.cat([(g == 0).reshape(-1) for g in blocks.values()]))
    assert not torch.equal(zero_sets[0], zero_sets[1])  # a fresh mask every step
    first = {n: g for n, g in recorder.grads[0].items() if n.startswith("model.transformer.h.")}
    for name, grad in first.items():  # kept entries are the plain gradient / reserve_p
        kept = grad != 0
        torch.testing.assert_close(grad[kept], plain.grads[0][name][kept] / 0.25)


def _reference_mask(fisher_batches: int, reserve_p: float = 0.3) -> dict[str, torch.Tensor]:
    """The D mask from the functional forms, on the initial model and the first batches."""
    model = tiny_gpt()
    params = {n: p for n, p in model.named_parameters() if n.startswith("model.transformer.h.")}
    batches = [b for _, b in zip(range(fisher_batches),
                                 DataLoader(CountingTokens(32), batch_size=8))]
    torch.manual_seed(123)
    fisher = fisher_information(model, batches, model.loss, params)
    return fisher_mask(fisher, reserve_p)


def test_d_mask_is_top_fisher_set_and_fixed() -> None:
    recorder = GradRecorder()
    algorithm = ChildTuning(mode="D", reserve_p=0.3, param_regex=BLOCKS, fisher_batches=2)
    run_trainer(tiny_gpt(), [algorithm], steps=3, callbacks=[recorder])
    expected = _reference_mask(2)
    assert algorithm.masks.keys() == expected.keys()
    total = sum(m.numel() for m in expected.values())
    assert sum(int(m.sum()) for m in expected.values()) == math.ceil(0.3 * total)
    for name, mask in expected.items():
        assert torch.equal(algorithm.masks[name], mask), name
        for step in recorder.grads:  # the same entries are zeroed every step, none rescaled
            assert (step[name][~mask] == 0).all()


class Observe(Callback):
    """The batches the run trains on and the torch RNG state at the first batch."""

    def __init__(self) -> None:
        self.batches: list[torch.Tensor] = []
        self.rng: Optional[torch.Tensor] = None

    def after_dataloader(self, state: State, logger: Any) -> None:
        self.batches.append(state.batch["input_ids"].clone())
        if self.rng is None:
            self.rng = torch.random.get_rng_state()


def test_fisher_pass_leaves_data_order_and_rng_alone() -> None:
    def observe(algorithms: list[Any]) -> Observe:
        observer = Observe()
        loader = DataLoader(CountingTokens(32), batch_size=8, shuffle=True)  # draws from RNG
        run_trainer(tiny_gpt(dropout=0.1), algorithms, steps=4, callbacks=[observer],
                    train_dataloader=loader)
        return observer

    plain = observe([])
    tuned = observe([ChildTuning(mode="D", fisher_batches=3, param_regex=BLOCKS)])
    assert all(torch.equal(a, b) for a, b in zip(plain.batches, tuned.batches))
    assert torch.equal(plain.rng, tuned.rng)


def test_fisher_batches_beyond_the_loader_uses_the_epoch() -> None:
    algorithm = ChildTuning(mode="D", fisher_batches=1000, param_regex=BLOCKS)
    run_trainer(tiny_gpt(), [algorithm], steps=1)
    expected = _reference_mask(4)  # the loader has 4 batches
    assert all(torch.equal(algorithm.masks[n], m) for n, m in expected.items())


@pytest.mark.parametrize("mode", ["D", "F"])
def test_resume_is_exact_and_keeps_the_mask(mode: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def trainer(**kwargs: Any) -> Trainer:
        algorithm = ChildTuning(mode=mode, reserve_p=0.3, fisher_batches=2)
        return run_trainer(tiny_gpt(dropout=0.1), [algorithm], steps=4, fit=False,
                           save_folder=str(tmp_path), run_name=f"ct-{mode}",
                           save_interval="2ba", **kwargs)

    straight = trainer()
    straight.fit()
    resumed = trainer(load_path=str(tmp_path / "ep0-ba2-rank0.pt"), save_overwrite=True)
    if mode == "D":
        import cadence.algorithms.child_tuning as module

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise AssertionError("the Fisher estimate was recomputed on resume")
        monkeypatch.setattr(module, "fisher_information", refuse)
        a, b = straight.state.algorithms[0].masks, resumed.state.algorithms[0].masks
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    resumed.fit()
    for (name, p), q in zip(straight.state.model.named_parameters(),
                            resumed.state.model.parameters()):
        assert torch.equal(p, q), name


@pytest.fixture(scope="module")
def single_rank_mask() -> dict[str, torch.Tensor]:
    """The D mask of a one-process run (computed once, in the parent process)."""
    algorithm = ChildTuning(mode="D", reserve_p=0.3, param_regex=BLOCKS, fisher_batches=3)
    run_trainer(tiny_gpt(), [algorithm], steps=1, fit=False).fit()
    return {n: m.clone() for n, m in algorithm.masks.items()}


@pytest.mark.world_size(2)
def test_d_mask_same_on_two_fsdp_ranks(single_rank_mask: dict[str, torch.Tensor],
                                       tmp_path: Path) -> None:
    from torch.distributed.tensor import DTensor

    recorder = GradRecorder()
    algorithm = ChildTuning(mode="D", reserve_p=0.3, param_regex=BLOCKS, fisher_batches=3)
    trainer = run_trainer(tiny_gpt(), [algorithm], steps=2, callbacks=[recorder],
                          parallelism_config={"fsdp": {}}, save_folder=str(tmp_path),
                          run_name="ct-fsdp", save_interval="2ba")
    assert all(isinstance(m, DTensor) for m in algorithm.masks.values())
    mismatched = {n: int((full(m) != single_rank_mask[n]).sum()) for n, m in
                  algorithm.masks.items()}
    assert sum(mismatched.values()) == 0, mismatched
    for step in recorder.grads:
        for name, mask in single_rank_mask.items():
            assert (step[name][~mask] == 0).all()
    # sharded checkpoints keep DTensor masks; full ones hold full masks, re-sharded on load
    full_path = save_checkpoint(trainer.state, tmp_path / "full.pt", "full")
    for path in (tmp_path / "ep0-ba2", full_path):
        again = ChildTuning(mode="D", reserve_p=0.3, param_regex=BLOCKS, fisher_batches=3)
        run_trainer(tiny_gpt(), [again], fit=False, parallelism_config={"fsdp": {}},
                    load_path=str(path))
        assert again.masks.keys() == algorithm.masks.keys()
        for name, mask in again.masks.items():
            assert isinstance(mask, DTensor) and mask.placements == algorithm.masks[name].placements
            assert torch.equal(local(mask), local(algorithm.masks[name])), (path, name)
    assert dist.get_world_size() == 2
