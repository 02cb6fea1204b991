"""``Trainer(precision='amp_bf16')`` is refused, with the fix, on a device without native
bf16 (a CUDA GPU before Ampere, or NCCL < 2.10); the CPU runs bf16 autocast and passes."""

from __future__ import annotations

import pytest
import torch

import cadence.utils.precision as precision_module
from cadence import Trainer
from cadence.utils.precision import check_precision
from tests.common.models import SimpleModel, make_dataloader


def make_trainer(precision: str = "fp32") -> Trainer:
    return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(num_batches=1),
                   max_duration="1ba", precision=precision, progress_bar=False, device="cpu")


def test_amp_bf16_refused_where_bf16_is_not_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision_module, "bf16_supported", lambda device=None: False)
    with pytest.raises(ValueError, match=r"precision='amp_bf16' is not natively supported on "
                                         r"cpu.*Use precision='amp_fp16'"):
        make_trainer("amp_bf16")
    make_trainer("amp_fp16")  # the other precisions are not checked
    trainer = make_trainer("fp32")
    with pytest.raises(ValueError, match="amp_fp16"):
        trainer.fit(precision="amp_bf16")  # fit()'s precision too, before it changes anything
    assert trainer.state.precision == "fp32"


def test_cpu_and_modern_gpus_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    check_precision("amp_bf16", torch.device("cpu"))  # torch runs bf16 autocast on any CPU
    make_trainer("amp_bf16")
    cuda = torch.cuda  # a pre-Ampere GPU: bf16 only emulated
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_bf16_supported",
                        lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(cuda.nccl, "version", lambda: (2, 21, 5))
    with pytest.raises(ValueError, match=r"Ampere or newer GPU.*is False"):
        check_precision("amp_bf16", torch.device("cuda:0"))
    monkeypatch.setattr(cuda, "is_bf16_supported", lambda including_emulation=True: True)
    check_precision("amp_bf16", torch.device("cuda:0"))  # an Ampere GPU
