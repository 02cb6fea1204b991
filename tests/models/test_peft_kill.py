"""LoRA adapter-only checkpoints survive SIGKILL: a real ``cadence train`` process running
``hf_pretrained`` with ``peft`` is killed between saves and inside a save, relaunched with the
same command (autoresume), and ends with the uninterrupted run's loss curve, bit for bit; every
checkpoint on disk holds only the adapters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from tests.checkpoint.test_kill_resume import (  # noqa: E402
    TOTAL, finish, launch, loss_curve, run_file,
)


def lora_model(tmp_path: Path) -> dict:
    """``hf_pretrained`` with LoRA on a tiny GPT-2 written with ``save_pretrained``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=None, eos_token_id=None)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "base")
    return {"name": "hf_pretrained", "pretrained_model_name_or_path": str(tmp_path / "base"),
            "peft": {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["c_attn"],
                     "fan_in_fan_out": True, "lora_dropout": 0.1}}


@pytest.mark.slow
def test_lora_sigkill_and_autoresume_give_the_uninterrupted_loss_curve(tmp_path: Path) -> None:
    model = lora_model(tmp_path)
    kill = {"marker_dir": str(tmp_path / "markers"), "batches": [3], "during_save": [6]}
    reference = launch(run_file(tmp_path, "reference", None, model=model))
    config = run_file(tmp_path, "killed", kill, model=model)
    for _ in range(2):  # killed after batch 3, then inside batch 6's save
        code, out = finish(launch(config))
        assert code == -9, out[-3000:]
    code, out = finish(launch(config))
    assert code == 0, out[-3000:]
    code, ref_out = finish(reference)
    assert code == 0, ref_out[-3000:]
    expected, got = loss_curve(tmp_path / "reference"), loss_curve(tmp_path / "killed")
    assert sorted(expected) == list(range(1, TOTAL + 1))
    assert got == expected  # bit-identical, every step
    for checkpoint in sorted((tmp_path / "killed").glob("ep*-ba*-rank0.pt")):
        saved = torch.load(checkpoint, weights_only=True)["state"]
        assert saved["model"] and all("lora_" in key for key in saved["model"]), checkpoint
        base = saved["metadata"]["adapter_only"]["base"]
        assert base["name_or_path"] == model["pretrained_model_name_or_path"]
