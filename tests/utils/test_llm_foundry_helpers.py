"""The smaller Composer names llm-foundry imports: ``safe_torch_load`` on a full checkpoint,
``get_hf_config_from_composer_state_dict``, ``maybe_get_underlying_model``,
``fsdp_state_dict_type_context``, ``GPU_AVAILABLE_FLOPS``, ``prepare_fsdp_module``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from cadence import Trainer, dist
from cadence.callbacks.speed_monitor import GPU_AVAILABLE_FLOPS
from cadence.core.state import fsdp_state_dict_type_context
from cadence.models import HuggingFaceModel
from cadence.models.huggingface import (
    get_hf_config_from_composer_state_dict, maybe_get_underlying_model, peft_installed,
)
from cadence.utils import safe_torch_load
from cadence.utils.checkpoint import save_checkpoint
from tests.common.models import SimpleModel, make_dataloader


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1,
                                       n_head=2, use_cache=False, bos_token_id=None,
                                       eos_token_id=None))
    model.loss_type = "ForCausalLM"
    return model


def test_safe_torch_load_and_hf_config_from_a_checkpoint(tmp_path: Path) -> None:
    model = HuggingFaceModel(tiny_gpt2())
    ids = torch.randint(0, 32, (4, 8))
    data = torch.utils.data.DataLoader(
        [{"input_ids": row, "labels": row} for row in ids], batch_size=2)
    trainer = Trainer(model=model, train_dataloader=data, max_duration="1ba",
                      progress_bar=False)
    trainer.fit()
    path = save_checkpoint(trainer.state, str(tmp_path / "ckpt.pt"))
    state_dict = safe_torch_load(path)
    assert set(state_dict["state"]["model"]) >= {"model.transformer.wte.weight"}
    config = get_hf_config_from_composer_state_dict(state_dict, {"n_layer": 3})
    assert type(config).__name__ == "GPT2Config" and config.n_embd == 8 and config.n_layer == 3
    with pytest.raises(ValueError, match="map_location"):
        safe_torch_load(path, map_location="cuda")


# peft reads transformers' deprecated is_gradient_checkpointing when it wraps a model
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_underlying_model_through_peft() -> None:
    base = tiny_gpt2()
    assert maybe_get_underlying_model(base) is base
    if not peft_installed:
        pytest.skip("peft is not installed")
    import peft

    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    assert maybe_get_underlying_model(wrapped) is base


def test_fsdp_state_dict_type_context_unsharded_and_bad_type() -> None:
    module = torch.nn.Linear(2, 2)
    with fsdp_state_dict_type_context(module, "full"):
        assert set(module.state_dict()) == {"weight", "bias"}
    with pytest.raises(NotImplementedError, match="state_dict_type"):
        with fsdp_state_dict_type_context(module, "local"):
            pass


def test_gpu_available_flops_in_composers_shape() -> None:
    assert GPU_AVAILABLE_FLOPS["a100"]["amp_bf16"] == GPU_AVAILABLE_FLOPS["a100"]["bf16"] == 312e12
    assert GPU_AVAILABLE_FLOPS["h200-sxm"] == GPU_AVAILABLE_FLOPS["h200"]


@pytest.mark.world_size(2)
def test_prepare_fsdp_module_shards_and_rebinds_the_optimizer() -> None:
    from torch.distributed.tensor import DTensor

    from cadence.distributed.dist_strategy import prepare_fsdp_module

    torch.manual_seed(0)
    model = SimpleModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prepare_fsdp_module(model, optimizer, {"sharding_strategy": "FULL_SHARD"}, "fp32",
                        torch.device("cpu"), auto_microbatching=False)
    params = list(model.parameters())
    assert params and all(isinstance(p, DTensor) for p in params)
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in params]
    x, y = next(iter(make_dataloader(num_batches=1)))
    before = [p.full_tensor().clone() for p in params]
    model.loss(model((x, y)), (x, y)).backward()
    optimizer.step()
    assert any(not torch.equal(b, p.full_tensor()) for b, p in zip(before, params))
    with pytest.raises(NotImplementedError, match="full"):
        with fsdp_state_dict_type_context(model, "full"):
            pass
    assert dist.get_world_size() == 2
