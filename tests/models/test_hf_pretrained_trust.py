"""A Hugging Face folder whose ``pytorch_model.bin`` holds a pickle payload: ``hf_pretrained``
refuses it naming the file, and the payload never runs (issue 25)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from cadence.models.gpt import hf_pretrained


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_poisoned_pytorch_model_bin_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32, n_positions=16,
                        bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    (folder / "model.safetensors").unlink()  # only the .bin is left to load
    marker = tmp_path / "PWNED"
    torch.save({"transformer.wte.weight": _Payload(marker)}, folder / "pytorch_model.bin")

    with pytest.raises(ValueError) as info:
        hf_pretrained(str(folder), task="causal_lm")
    message = str(info.value)
    assert str(folder / "pytorch_model.bin") in message
    assert "nothing in them ran" in message and "weights_only=False" not in message
    assert not marker.exists()
