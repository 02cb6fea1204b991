"""LoRA adapter-only checkpoints survive SIGKILL: a real ``cadence train`` process running
``hf_pretrained`` with ``peft`` is killed between saves and inside a save, relaunched with the
same command (autoresume), and ends with the uninterrupted run's loss curve, bit for bit; every
checkpoint on disk holds only the adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytest.importorskip("peft")

from tests.checkpoint.test_kill_resume import finish, launch, loss_curve  # noqa: E402

TOTAL = 8  # batches


def base_dir(tmp_path: Path) -> Path:
    """A tiny GPT-2 written with ``save_pretrained``: the frozen base."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=None, eos_token_id=None)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def run_file(tmp_path: Path, name: str, base: Path, kill: dict[str, Any] | None) -> Path:
    config: dict[str, Any] = {
        "run_name": "lora-killed", "seed": 17, "max_duration": f"{TOTAL}ba",
        "global_train_batch_size": 4, "log_interval": "1ba", "progress_bar": False,
        "device": "cpu",
        "model": {"name": "hf_pretrained", "pretrained_model_name_or_path": str(base),
                  "peft": {"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                           "target_modules": ["c_attn"], "fan_in_fan_out": True,
                           "lora_dropout": 0.1}},
        "train_loader": {"name": "shakespeare", "split": "train", "seq_len": 32,
                         "vocab_size": 512, "max_samples": 16},
        "optimizer": {"name": "adamw", "lr": 1.0e-2},
        "loggers": {"file": {}},
        "save_folder": str(tmp_path / name), "save_interval": "2ba", "autoresume": True,
    }
    if kill is not None:
        config["callbacks"] = {"tests.common.killing.KillAt": kill}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_lora_sigkill_and_autoresume_give_the_uninterrupted_loss_curve(tmp_path: Path) -> None:
    base = base_dir(tmp_path)
    kill = {"marker_dir": str(tmp_path / "markers"), "batches": [3], "during_save": [6]}
    reference = launch(run_file(tmp_path, "reference", base, None))
    config = run_file(tmp_path, "killed", base, kill)
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
        assert saved["metadata"]["adapter_only"]["base"]["name_or_path"] == str(base)
