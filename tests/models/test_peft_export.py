"""Exporting a LoRA run: ``cadence convert --to hf`` writes the adapter in ``peft``'s format
(``PeftModel.from_pretrained`` on the base gives the trained model's logits) and, with
``--merge``, the merged full model (the same logits, without ``peft``). The 2-rank FSDP2 loss
curve and the bit-identical base are covered by tests/models/test_peft.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from peft import PeftModel  # noqa: E402
from transformers import GPT2LMHeadModel  # noqa: E402

from cadence.checkpoint.checkpoint import CheckpointError  # noqa: E402
from cadence.models.hf_export import to_huggingface  # noqa: E402
from cadence.cli import main as cadence_main  # noqa: E402
from cadence.models import HuggingFaceModel  # noqa: E402
from tests.models.test_peft import base_model, lora, run  # noqa: E402

IDS = torch.tensor([[3, 9, 27, 4, 11, 50, 8, 2, 33, 14, 7, 1]])


def _trained(tmp_path: Path, save_peft_only: bool, steps: int = 4
             ) -> tuple[HuggingFaceModel, Path, Path]:
    """A LoRA run on a base read from a directory; its logits model, checkpoint, base dir."""
    base_dir = tmp_path / "base"
    base_model(seed=0, n_embd=64, dropout=0.0).save_pretrained(base_dir)
    base = GPT2LMHeadModel.from_pretrained(base_dir)
    torch.manual_seed(1)
    model = HuggingFaceModel(base, peft_config=lora(0.0), should_save_peft_only=save_peft_only)
    run(tmp_path / "run", model, max_duration=f"{steps}ba")
    checkpoint = tmp_path / "run" / "latest-rank0.pt"
    assert checkpoint.exists(), sorted(p.name for p in (tmp_path / "run").iterdir())
    return model.eval(), checkpoint, base_dir


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


# peft 0.21 reads transformers 5's deprecated is_gradient_checkpointing in from_pretrained
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("save_peft_only", [True, False], ids=["adapter_only", "full"])
def test_exported_adapter_and_merged_model_give_the_trained_logits(tmp_path: Path,
                                                                   save_peft_only: bool) -> None:
    model, checkpoint, base_dir = _trained(tmp_path, save_peft_only)
    trained = _logits(model.model)
    base_only = _logits(GPT2LMHeadModel.from_pretrained(base_dir).eval())
    assert not torch.allclose(trained, base_only, atol=1e-4)  # the adapter learned something

    adapter = tmp_path / "adapter"
    assert cadence_main(["convert", str(checkpoint), "--to", "hf", str(adapter)]) == 0
    assert {p.name for p in adapter.iterdir()} >= {"adapter_config.json",
                                                   "adapter_model.safetensors"}
    assert not (adapter / "model.safetensors").exists()
    loaded = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(base_dir), adapter).eval()
    torch.testing.assert_close(_logits(loaded), trained, atol=1e-5, rtol=1e-5)

    merged = tmp_path / "merged"
    assert cadence_main(["convert", str(checkpoint), "--to", "hf", str(merged), "--merge"]) == 0
    full = GPT2LMHeadModel.from_pretrained(merged).eval()
    assert not any("lora" in name for name, _ in full.named_parameters())
    torch.testing.assert_close(_logits(full), trained, atol=1e-5, rtol=1e-5)


def test_adapter_only_export_refuses_a_changed_base(tmp_path: Path, capsys) -> None:
    _, checkpoint, base_dir = _trained(tmp_path, save_peft_only=True, steps=1)
    base_model(seed=5, n_embd=64, dropout=0.0).save_pretrained(base_dir)  # other weights
    assert cadence_main(["convert", str(checkpoint), "--to", "hf", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert "CRC32C" in err and str(base_dir) in err


def test_merge_needs_a_peft_checkpoint(tmp_path: Path, capsys) -> None:
    model = HuggingFaceModel(base_model(n_embd=64, dropout=0.0))
    run(tmp_path / "run", model, max_duration="1ba")
    checkpoint = tmp_path / "run" / "latest-rank0.pt"
    code = cadence_main(["convert", str(checkpoint), "--to", "hf", str(tmp_path / "m"),
                         "--merge"])
    assert code == 1 and "holds no peft adapter" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="no peft adapter"):
        to_huggingface(checkpoint, tmp_path / "m2", merge=True)


def test_the_lora_pipeline_run_files_validate(tmp_path: Path) -> None:
    """yamls/lora_kjv.yaml (and the quickstart with the pipeline's overrides) pass every
    check of `cadence train` on a stand-in base directory; nothing is trained."""
    from cadence.config.load import ConfigError, load_config

    yamls = Path(__file__).resolve().parents[2] / "yamls"
    base = tmp_path / "base"
    base_model(n_embd=64, dropout=0.0).save_pretrained(base)
    config = load_config(yamls / "lora_kjv.yaml", [f"variables.base={base}",
                                                   f"save_folder={tmp_path / 'run'}"])
    assert config.model["peft"]["peft_type"] == "LORA"
    assert config.train_loader["name"] == "kjv_instruction"
    load_config(yamls / "quickstart.yaml", [f"save_folder={tmp_path / 'q'}",
                                            "save_interval=360ba"])
    with pytest.raises(ConfigError, match="lora_alpah"):
        load_config(yamls / "lora_kjv.yaml", [f"variables.base={base}",
                                              "model.peft.lora_alpah=3"])
