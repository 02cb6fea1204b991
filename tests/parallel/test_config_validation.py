"""The typed settings validate themselves: a ``FSDPConfig``, ``TPConfig``,
``ParallelismConfig`` or ``CompileConfig`` built in Python is refused with the run file's own
message (issue 30: ``FSDPConfig(sharding_strategy="FULL_SHARDD")`` used to be accepted)."""

from __future__ import annotations

import pytest

from cadence.config.schema import check_schema
from cadence.parallel.compile_config import CompileConfig, check_compile_config
from cadence.parallel.config import (
    FSDPConfig, ParallelismConfig, TPConfig, check_parallelism_config,
)
from cadence.registry.errors import ConfigError


def _run_file_problems(raw: dict) -> list[str]:
    """The problems the run file's first stage reports for ``raw``'s one section (as
    ``key: message``; the file's other problems, such as missing required keys, left out)."""
    (section,) = raw
    _, problems = check_schema(raw)
    return [str(p) for p in problems if p.key.startswith(section)]


def test_fsdp_config_refuses_a_misspelt_sharding_strategy() -> None:
    with pytest.raises(ConfigError) as caught:
        FSDPConfig(sharding_strategy="FULL_SHARDD")
    message = str(caught.value)
    assert "parallelism_config.fsdp.sharding_strategy" in message
    assert "'FULL_SHARDD'" in message
    assert "Did you mean 'FULL_SHARD'?" in message
    assert "SHARD_GRAD_OP" in message  # the allowed values are listed
    # the run file's message for the same value, word for word
    from_run_file = _run_file_problems(
        {"parallelism_config": {"fsdp": {"sharding_strategy": "FULL_SHARDD"}}})
    assert [str(p) for p in caught.value.problems] == from_run_file


def test_fsdp_config_names_every_bad_value_and_keeps_canonical_spellings() -> None:
    with pytest.raises(ConfigError) as caught:
        FSDPConfig(min_num_params=0, state_dict_type="shardd", limit_all_gathers=False)
    keys = [p.key for p in caught.value.problems]
    assert keys == ["parallelism_config.fsdp.limit_all_gathers",
                    "parallelism_config.fsdp.min_num_params",
                    "parallelism_config.fsdp.state_dict_type"]
    config = FSDPConfig(sharding_strategy="hybrid_shard", state_dict_type="FULL_STATE_DICT")
    assert (config.sharding_strategy, config.state_dict_type) == ("HYBRID_SHARD", "full")


def test_tp_config_refuses_a_bad_degree_and_style() -> None:
    with pytest.raises(ConfigError) as caught:
        TPConfig(tensor_parallel_degree=0)
    assert [p.key for p in caught.value.problems] == ["parallelism_config.tp.tensor_parallel_degree"]
    assert "0 must be a positive int" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        TPConfig(tensor_parallel_degree=2, layer_plan={"*.attn": "colwize"})
    from_run_file = _run_file_problems({"parallelism_config": {"tp": {
        "tensor_parallel_degree": 2, "layer_plan": {"*.attn": "colwize"}}}})
    assert [str(p) for p in caught.value.problems] == from_run_file
    assert "Did you mean 'colwise'?" in str(caught.value)


def test_parallelism_config_checks_its_sections() -> None:
    with pytest.raises(ConfigError, match=r"parallelism_config\.fsdp: 'FULL_SHARD' must be an "
                                          r"FSDPConfig"):
        ParallelismConfig(fsdp="FULL_SHARD")  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        ParallelismConfig(fsdp={"sharding_strategy": "SHARD_GRAD_OPP"})  # type: ignore[arg-type]
    assert "Did you mean 'SHARD_GRAD_OP'?" in str(caught.value)
    typed = ParallelismConfig(fsdp={"sharding_strategy": "shard_grad_op"},  # type: ignore
                              tp={"tensor_parallel_degree": 2})  # type: ignore[arg-type]
    assert isinstance(typed.fsdp, FSDPConfig) and typed.fsdp.sharding_strategy == "SHARD_GRAD_OP"
    assert isinstance(typed.tp, TPConfig) and typed.tp_degree == 2


def test_compile_config_refuses_a_misspelt_mode() -> None:
    with pytest.raises(ConfigError) as caught:
        CompileConfig(mode="max-autotun")
    assert [p.key for p in caught.value.problems] == ["compile_config.mode"]
    assert "Did you mean 'max-autotune'?" in str(caught.value)
    from_run_file = _run_file_problems({"compile_config": {"mode": "max-autotun"}})
    assert [str(p) for p in caught.value.problems] == from_run_file
    with pytest.raises(ConfigError, match="is an inductor mode, but backend is 'eager'"):
        CompileConfig(mode="max-autotune", backend="eager")
    assert CompileConfig(mode=None).mode == "default"  # type: ignore[arg-type]


def test_one_set_of_checks_typed_objects_pass_through() -> None:
    """A typed section was checked when it was built: the run file's check takes it as it is
    (it re-parses nothing), and a dict gives an equal object."""
    fsdp, tp = FSDPConfig(sharding_strategy="SHARD_GRAD_OP"), TPConfig(tensor_parallel_degree=2)
    config, problems = check_parallelism_config({"fsdp": fsdp, "tp": tp})
    assert not problems and config.fsdp is fsdp and config.tp is tp
    from_dict, _ = check_parallelism_config({"fsdp": {"sharding_strategy": "SHARD_GRAD_OP"},
                                             "tp": {"tensor_parallel_degree": 2}})
    assert from_dict == ParallelismConfig(fsdp=fsdp, tp=tp)
    compiled, problems = check_compile_config({"mode": "reduce-overhead"}, check_backend=False)
    assert not problems and compiled == CompileConfig(mode="reduce-overhead")
