"""MixedPrecision: sets the precision before the model is sharded and the optimizer built;
bf16 matmuls under autocast with an fp32-close loss; fp16 gets a gradient scaler; FSDP2
keeps norm layers in fp32; checkpoints always hold fp32 weights; ``bf16_supported``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cadence import Trainer
from cadence.algorithms import MixedPrecision
from cadence.checkpoint import save_checkpoint
from cadence.loggers import InMemoryLogger
from cadence.parallel.fsdp import is_norm_module, norm_mixed_precision_policy
from cadence.utils import bf16_supported
from tests.algorithms.algorithm_helpers import full, run_trainer, tiny_gpt
from tests.common.models import SimpleModel, make_dataloader


def _record_dtypes(model: torch.nn.Module, kind: type) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    for module in model.modules():
        if isinstance(module, kind):
            module.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    return seen


def _first_loss(algorithms: list[Any]) -> tuple[float, Trainer, list[torch.dtype]]:
    torch.manual_seed(0)
    model = SimpleModel()
    dtypes = _record_dtypes(model, torch.nn.Linear)
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=make_dataloader(num_batches=2),
                      max_duration="2ba", algorithms=algorithms, loggers=[memory],
                      log_interval="1ba", progress_bar=False, seed=0, device="cpu")
    trainer.fit()
    return memory.data["loss/train/total"][0][1], trainer, dtypes


def test_bf16_autocast_matmuls_and_loss_close_to_fp32() -> None:
    reference, _, dtypes32 = _first_loss([])
    loss, trainer, dtypes = _first_loss([MixedPrecision("amp_bf16")])
    assert trainer.state.precision == "amp_bf16"
    assert set(dtypes32) == {torch.float32}
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert loss == pytest.approx(reference, rel=2e-2)
    assert trainer.grad_scaler is None
    for p in trainer.state.model.parameters():  # weights and gradients stay fp32
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32


def test_fp16_gets_a_grad_scaler_and_fp32_resets_precision() -> None:
    _, trainer, dtypes = _first_loss([MixedPrecision("amp_fp16")])
    assert isinstance(trainer.grad_scaler, torch.amp.GradScaler)
    assert set(dtypes) == {torch.float16}
    trainer = Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), max_duration="1ba",
                      precision="amp_bf16", algorithms=[MixedPrecision("fp32")],
                      progress_bar=False, device="cpu")
    assert trainer.state.precision == "fp32"
    with pytest.raises(ValueError, match="amp_bf8"):
        MixedPrecision("amp_bf8")


def test_checkpoint_holds_fp32_weights(tmp_path: Path) -> None:
    _, trainer, _ = _first_loss([MixedPrecision("amp_bf16")])
    path = save_checkpoint(trainer.state, tmp_path / "ckpt.pt", "full")
    model_sd = torch.load(path, weights_only=True)["state"]["model"]
    assert {t.dtype for t in model_sd.values()} == {torch.float32}


def test_bf16_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    assert bf16_supported("cpu") is True
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(cuda.nccl, "version", lambda: (2, 21, 5))
    assert bf16_supported("cuda") is True
    monkeypatch.setattr(cuda.nccl, "version", lambda: (2, 9, 9))
    assert bf16_supported("cuda") is False  # NCCL too old for bf16 all-reduce
    monkeypatch.setattr(cuda.nccl, "version", lambda: (2, 21, 5))
    monkeypatch.setattr(cuda, "is_bf16_supported",
                        lambda including_emulation=True: including_emulation)
    assert bf16_supported("cuda") is False  # emulated only (pre-Ampere)


def test_amp_bf16_refused_where_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    import cadence.algorithms.mixed_precision as module

    monkeypatch.setattr(module, "bf16_supported", lambda device=None: False)
    with pytest.raises(ValueError, match="amp_fp16"):
        Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), max_duration="1ba",
                algorithms=[MixedPrecision("amp_bf16")], progress_bar=False, device="cpu")


def test_norm_policy() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    assert norm_mixed_precision_policy(MixedPrecisionPolicy()) is None
    policy = norm_mixed_precision_policy(MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    assert policy is not None
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (
        torch.float32, torch.float32, torch.bfloat16)
    assert is_norm_module(torch.nn.LayerNorm(4)) and not is_norm_module(torch.nn.Linear(2, 2))


@pytest.mark.world_size(2)
def test_fsdp_bf16_keeps_norms_and_checkpoints_fp32(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.fsdp import FSDPModule

    model = tiny_gpt()
    seen: dict[str, set[torch.dtype]] = {"norm_weight": set(), "norm_in": set(),
                                         "linear_weight": set(), "logits": set()}

    def norm_hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        seen["norm_weight"].add(module.weight.dtype)
        seen["norm_in"].add(args[0].dtype)

    def linear_hook(module: Any, args: tuple[Any, ...], output: Any) -> None:
        seen["linear_weight"].add(module.weight.dtype)

    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.register_forward_hook(norm_hook)
        elif type(module).__name__ == "Conv1D":  # GPT-2's linear layers
            module.register_forward_hook(linear_hook)
    memory = InMemoryLogger()
    trainer = run_trainer(model, [MixedPrecision("amp_bf16")], steps=3, loggers=[memory],
                          log_interval="1ba", parallelism_config={"fsdp": {}})
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 5 and all(isinstance(m, FSDPModule) for m in norms)
    assert seen["norm_weight"] == {torch.float32} and seen["norm_in"] == {torch.float32}
    assert seen["linear_weight"] == {torch.bfloat16}
    # sharded parameters, gradients and optimizer state stay fp32
    for p in trainer.state.model.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
    losses = [v for _, v in memory.data["loss/train/total"]]
    reference = _fp32_single_process_losses()
    assert losses == pytest.approx(reference, rel=3e-2)

    full_path = save_checkpoint(trainer.state, tmp_path / "full.pt", "full")
    sharded_path = save_checkpoint(trainer.state, tmp_path / "sharded", "sharded")
    if torch.distributed.get_rank() == 0:
        model_sd = torch.load(full_path, weights_only=True)["state"]["model"]
        assert {t.dtype for t in model_sd.values()} == {torch.float32}
    metadata = FileSystemReader(str(sharded_path)).read_metadata()
    dtypes = {meta.properties.dtype for key, meta in metadata.state_dict_metadata.items()
              if key.startswith("model.") and hasattr(meta, "properties")}
    assert dtypes == {torch.float32}
    assert {full(p).dtype for p in trainer.state.model.parameters()} == {torch.float32}


def _fp32_single_process_losses() -> list[float]:
    """The same 3 steps in fp32 without FSDP, in this process alone, on the global batches."""
    from torch.utils.data import DataLoader

    from tests.algorithms.algorithm_helpers import CountingTokens

    model = tiny_gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _, batch in zip(range(3), DataLoader(CountingTokens(32), batch_size=8)):
        optimizer.zero_grad()
        loss = model.loss(model(batch), batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
