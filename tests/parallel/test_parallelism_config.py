"""Bad fsdp keys and values fail with messages that name the key and the fix."""

from __future__ import annotations

import pytest

from cadence.parallel.config import FSDPConfig, parse_parallelism_config
from cadence.parallel.mesh import mesh_shape


def problems(fsdp: dict) -> str:
    with pytest.raises(ValueError) as info:
        parse_parallelism_config({"fsdp": fsdp})
    return str(info.value)


def test_defaults_and_composer_keys_map() -> None:
    cfg = parse_parallelism_config({"fsdp": {
        "sharding_strategy": "shard_grad_op", "mixed_precision": "PURE", "cpu_offload": True,
        "forward_prefetch": True, "limit_all_gathers": True, "use_orig_params": True,
        "load_monolith_rank0_only": True, "verbose": True,
    }}).fsdp
    assert cfg is not None
    assert cfg.sharding_strategy == "SHARD_GRAD_OP" and cfg.mixed_precision == "PURE"
    assert cfg.cpu_ram_efficient_loading and cfg.cpu_offload and cfg.forward_prefetch
    assert parse_parallelism_config(None).fsdp is None
    assert parse_parallelism_config({"fsdp": {}}).fsdp == FSDPConfig()


def test_accelerate_spellings_map() -> None:
    cfg = parse_parallelism_config({"fsdp": {
        "fsdp_sharding_strategy": "_HYBRID_SHARD_ZERO2", "fsdp_offload_params": False,
        "fsdp_transformer_layer_cls_to_wrap": "GPT2Block", "fsdp_version": 2,
        "fsdp_cpu_ram_efficient_loading": True,
    }}).fsdp
    assert cfg is not None and cfg.sharding_strategy == "HYBRID_SHARD_ZERO2"
    assert cfg.transformer_layer_cls == ["GPT2Block"] and cfg.cpu_ram_efficient_loading


def test_unknown_key_did_you_mean() -> None:
    message = problems({"shardin_strategy": "FULL_SHARD"})
    assert "parallelism_config.fsdp.shardin_strategy" in message
    assert "Did you mean 'sharding_strategy'" in message


def test_bad_enum_values_list_the_allowed() -> None:
    message = problems({"sharding_strategy": "FULLSHARD", "mixed_precision": "HALF"})
    assert "2 problem(s)" in message
    assert "'FULLSHARD' is not one of: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD" in message
    assert "Did you mean 'FULL_SHARD'" in message
    assert "'HALF' is not one of: DEFAULT, PURE, FULL" in message


def test_keys_without_fsdp2_meaning_are_refused_with_the_reason() -> None:
    message = problems({"process_group": "x", "backward_prefetch": "BACKWARD_POST",
                        "limit_all_gathers": False, "use_orig_params": False, "fsdp_version": 1,
                        "mixed_precision": {"param_dtype": "bf16", "buffer_dtype": "bf16"}})
    assert "6 problem(s)" in message
    assert "process_group: not supported under FSDP2" in message and "data_parallel" in message
    assert "'BACKWARD_POST' has no FSDP2 equivalent" in message
    assert "limit_all_gathers: False has no FSDP2 equivalent" in message
    assert "use_orig_params: False has no FSDP2 equivalent" in message
    assert "FSDP2 only" in message
    assert "mixed_precision.buffer_dtype: FSDP2 does not manage buffers" in message


def test_wrong_types() -> None:
    message = problems({"cpu_offload": "yes", "min_num_params": 1.5,
                        "data_parallel_shard_degree": 0})
    assert "cpu_offload: 'yes' (str) is not a bool" in message
    assert "min_num_params: 1.5 (float) is not a int" in message
    assert "data_parallel_shard_degree: 0 must be a positive int or -1" in message


def test_other_parallelism_is_refused() -> None:
    with pytest.raises(ValueError, match="cp: not supported: .* context parallelism needs CUDA"):
        parse_parallelism_config({"cp": {"degree": 2}})
    with pytest.raises(ValueError, match="Did you mean 'fsdp'"):
        parse_parallelism_config({"fdsp": {}})


@pytest.mark.parametrize(
    ("fsdp", "world", "local", "shape"),
    [({}, 2, 2, (2,)), ({"sharding_strategy": "NO_SHARD"}, 2, 2, (2, 1)),
     ({"sharding_strategy": "HYBRID_SHARD"}, 8, 4, (2, 4)),
     ({"sharding_strategy": "HYBRID_SHARD", "data_parallel_replicate_degree": 2}, 2, 2, (2, 1)),
     ({"sharding_strategy": "HYBRID_SHARD", "data_parallel_shard_degree": 2}, 2, 2, (1, 2))],
)
def test_mesh_shapes(fsdp: dict, world: int, local: int, shape: tuple[int, ...]) -> None:
    cfg = parse_parallelism_config({"fsdp": fsdp}).fsdp
    assert cfg is not None and mesh_shape(cfg, world, local) == shape


def test_mesh_degree_errors() -> None:
    cfg = parse_parallelism_config({"fsdp": {"data_parallel_replicate_degree": 2}}).fsdp
    assert cfg is not None
    with pytest.raises(ValueError, match="needs a HYBRID sharding strategy"):
        mesh_shape(cfg, 4, 4)
    cfg = parse_parallelism_config({"fsdp": {"sharding_strategy": "HYBRID_SHARD",
                                             "data_parallel_replicate_degree": 3}}).fsdp
    assert cfg is not None
    with pytest.raises(ValueError, match=r"\(3\) x data_parallel_shard_degree"):
        mesh_shape(cfg, 4, 4)


def test_trainer_rejects_bad_config_before_any_event() -> None:
    from cadence import Trainer
    from tests.common.events import EventCounter
    from tests.common.models import SimpleModel, make_dataloader

    counter = EventCounter()
    with pytest.raises(ValueError, match="Did you mean 'sharding_strategy'"):
        Trainer(model=SimpleModel(), train_dataloader=make_dataloader(), max_duration="1ba",
                callbacks=[counter], progress_bar=False,
                parallelism_config={"fsdp": {"sharding_stratgy": "FULL_SHARD"}})
    assert counter.events == []


def test_fsdp_activation_checkpointing_key_is_the_plans_first_step() -> None:
    """The fsdp keys become the plan's activation-checkpointing step; the algorithm is not
    added (the Trainer imports none), and blocks the algorithm already checkpointed at INIT
    keep its settings."""
    from cadence import Trainer
    from cadence.algorithms.activation_checkpointing import ActivationCheckpointing
    from cadence.models.gpt import gpt2
    from cadence.parallel import ParallelPlan
    from cadence.parallel.activation_checkpointing import (
        apply_ac, apply_activation_checkpointing, is_checkpointed,
    )

    plan = ParallelPlan(parse_parallelism_config(
        {"fsdp": {"activation_checkpointing": False, "activation_cpu_offload": True}}))
    assert plan.activation_checkpointing is not None
    assert (plan.activation_checkpointing.every_n, plan.activation_checkpointing.offload_to_cpu) \
        == (0, True)
    model = gpt2(n_layer=2, n_head=2, n_embd=16, vocab_size=32, max_seq_len=8)
    apply_activation_checkpointing(model, every_n=2)  # what the algorithm does at INIT
    assert apply_ac(model, plan.activation_checkpointing) == {"checkpointed": [], "offloaded": []}
    assert [is_checkpointed(b) for b in model.model.transformer.h] == [False, True]
    trainer = Trainer(model=gpt2(n_layer=1, n_head=2, n_embd=16, vocab_size=32, max_seq_len=8),
                      progress_bar=False, device="cpu",
                      parallelism_config={"fsdp": {"activation_checkpointing": True}})
    assert not any(isinstance(a, ActivationCheckpointing) for a in trainer.state.algorithms)
    assert all(is_checkpointed(b) for b in trainer.state.model.model.transformer.h)


def test_trainer_parses_a_dict_once_and_takes_typed_settings_as_they_are() -> None:
    """A dict from Python is parsed at the Trainer's edge into the typed object; a typed
    object (what load_config produces) is the very object the Trainer keeps."""
    from cadence import Trainer
    from cadence.parallel.compile_config import CompileConfig
    from cadence.parallel.config import ParallelismConfig
    from tests.common.models import SimpleModel, make_dataloader

    def trainer(**kwargs: object) -> Trainer:
        return Trainer(model=SimpleModel(), train_dataloader=make_dataloader(),
                       max_duration="1ba", progress_bar=False, device="cpu", **kwargs)

    from_dict = trainer(parallelism_config={}, compile_config={"enabled": False})
    assert isinstance(from_dict.parallelism_config, ParallelismConfig)
    assert from_dict.compile_config == CompileConfig(enabled=False)
    typed = ParallelismConfig()
    compiled = CompileConfig(enabled=False)
    kept = trainer(parallelism_config=typed, compile_config=compiled)
    assert kept.parallelism_config is typed and kept.compile_config is compiled
    assert parse_parallelism_config(typed) is typed
