"""``apply_compile``: config validation, which modules are compiled, and that a compiled
model computes what the eager one does.

Most compile tests use dynamo's ``aot_eager`` backend: it runs the same tracing and
AOTAutograd as inductor but skips code generation (~2 s). One test compiles with inductor
(C++ code generation on CPU: 20-40 s on 2 cores with a cold cache, ~10 s warm); it is
skipped without a C++ compiler or with ``CADENCE_SKIP_INDUCTOR=1``.
"""

from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch
from torch import nn

from cadence.models.gpt import gpt2
from cadence.parallel.compile import (
    COMPILE_MODES, CompileConfig, apply_compile, compile_targets, is_compiled,
    parse_compile_config,
)

# Dynamo reads `.grad` of the non-leaf activations a block receives while tracing and
# hides the resulting UserWarning by swapping warnings.showwarning
# (torch/_dynamo/variables/builder.py: safe_has_grad), which an "error" filter bypasses;
# the warning is dynamo-internal and never reaches a user.
DYNAMO_GRAD_WARNING = "ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning"

VOCAB, SEQ = 128, 16


def tiny_gpt2(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return gpt2(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, max_seq_len=SEQ)


def lm_batch(seed: int = 1) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids.clone()}


def loss_and_grads(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    loss = model.loss(model(batch), batch)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with empty dynamo caches and counters."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- config
def test_none_and_disabled_leave_the_model_alone():
    model = tiny_gpt2()
    assert parse_compile_config(None) is None
    assert apply_compile(model, None) is model
    assert apply_compile(model, {"enabled": False}) is model
    assert not any(is_compiled(m) for m in model.modules())


def test_defaults():
    config = parse_compile_config({})
    assert config == CompileConfig(enabled=True, mode="default", fullgraph=False, dynamic=None,
                                   backend="inductor", per_block=True)
    assert config.compile_kwargs() == {"backend": "inductor", "fullgraph": False,
                                       "dynamic": None}
    assert parse_compile_config(CompileConfig(mode="max-autotune")).compile_kwargs()["mode"] \
        == "max-autotune"
    assert set(COMPILE_MODES) == {"default", "reduce-overhead", "max-autotune",
                                  "max-autotune-no-cudagraphs"}


@pytest.mark.parametrize("raw, fragments", [
    ({"per_blok": True}, ["compile.per_blok", "unknown key", "Did you mean 'per_block'?",
                          "Allowed: enabled, mode"]),
    ({"mode": "max_autotune"}, ["compile.mode", "'max_autotune'", "reduce-overhead",
                                "Did you mean 'max-autotune'?"]),
    ({"backend": "inductr"}, ["compile.backend", "'inductr'", "aot_eager",
                              "Did you mean 'inductor'?"]),
    ({"enabled": "yes"}, ["compile.enabled", "'yes'", "true or false"]),
    ({"fullgraph": 1}, ["compile.fullgraph", "true or false"]),
    ({"dynamic": "auto"}, ["compile.dynamic", "true, false or null"]),
    ({"backend": "eager", "mode": "max-autotune"}, ["compile.mode", "inductor mode",
                                                    "backend: inductor"]),
])
def test_bad_config_names_key_value_and_allowed(raw, fragments):
    with pytest.raises(ValueError) as info:
        parse_compile_config(raw)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ValueError, match=r"3 problem\(s\) in compile") as info:
        parse_compile_config({"enable": True, "mode": "fast", "per_block": "no"})
    message = str(info.value)
    assert "Did you mean 'enabled'?" in message and "'fast'" in message
    assert "compile.per_block" in message


def test_not_a_dict_is_refused():
    with pytest.raises(ValueError, match="compile must be a dict"):
        parse_compile_config(["inductor"])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- targets
def test_per_block_targets_are_the_no_split_modules():
    model = tiny_gpt2()
    targets = compile_targets(model, per_block=True)
    assert [name for name, _ in targets] == ["model.transformer.h.0", "model.transformer.h.1"]
    assert all(type(m).__name__ == "GPT2Block" for _, m in targets)
    assert compile_targets(model, per_block=False) == [("", model)]


def test_per_block_on_a_model_without_blocks_says_what_to_do():
    from tests.common.models import SimpleModel

    with pytest.raises(ValueError, match="per_block: false"):
        apply_compile(SimpleModel(), {"backend": "eager"})


def test_fsdp_wrap_fn_answering_a_dict_selects_the_module():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def fsdp_wrap_fn(self, module: nn.Module) -> object:
            return {} if isinstance(module, nn.Linear) else False

    assert [n for n, _ in compile_targets(Model())] == ["blocks.0", "blocks.1"]


# ----------------------------------------------------------------------------- compiling
@pytest.mark.filterwarnings(DYNAMO_GRAD_WARNING)
def test_per_block_compile_matches_eager_and_really_compiles():
    from torch._dynamo.utils import counters

    eager = tiny_gpt2()
    compiled = copy.deepcopy(eager)
    keys_before = list(compiled.state_dict())
    assert apply_compile(compiled, {"backend": "aot_eager", "per_block": True}) is compiled

    blocks = [m for _, m in compile_targets(compiled)]
    assert all(is_compiled(block) for block in blocks)
    assert not is_compiled(compiled) and not is_compiled(compiled.model)
    assert list(compiled.state_dict()) == keys_before  # compiled in place: same keys

    batch = lm_batch()
    loss_eager, grads_eager = loss_and_grads(eager, batch)
    loss_compiled, grads_compiled = loss_and_grads(compiled, batch)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo traced at least one graph
    assert counters["aot_autograd"]["total"] >= 1  # ... and AOTAutograd compiled it
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-5, atol=1e-6)
    for g_compiled, g_eager in zip(grads_compiled, grads_eager):
        torch.testing.assert_close(g_compiled, g_eager, rtol=1e-4, atol=1e-6)


@pytest.mark.filterwarnings(DYNAMO_GRAD_WARNING)
def test_whole_model_compile_matches_eager():
    from torch._dynamo.utils import counters

    eager = tiny_gpt2()
    compiled = copy.deepcopy(eager)
    apply_compile(compiled, {"backend": "aot_eager", "per_block": False})
    assert is_compiled(compiled)
    assert not any(is_compiled(m) for _, m in compiled.named_modules() if m is not compiled)
    batch = lm_batch()
    loss_eager, _ = loss_and_grads(eager, batch)
    loss_compiled, _ = loss_and_grads(compiled, batch)
    assert counters["stats"]["unique_graphs"] >= 1
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings(DYNAMO_GRAD_WARNING)
def test_compiled_model_trains_in_the_trainer():
    from cadence import Trainer

    model = apply_compile(tiny_gpt2(), {"backend": "aot_eager"})
    batches = [lm_batch(seed) for seed in range(3)]
    trainer = Trainer(model=model, train_dataloader=batches, max_duration="3ba",
                      progress_bar=False, device="cpu", seed=0)
    trainer.fit()
    trainer.close()
    assert trainer.state.timestamp.batch == 3
    assert torch.isfinite(trainer.state.total_loss)
    assert all(is_compiled(m) for _, m in compile_targets(model))


@pytest.mark.skipif(not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")),
                    reason="inductor on CPU needs a C++ compiler (g++, c++ or clang++)")
@pytest.mark.skipif(os.environ.get("CADENCE_SKIP_INDUCTOR") == "1",
                    reason="CADENCE_SKIP_INDUCTOR=1")
@pytest.mark.filterwarnings(DYNAMO_GRAD_WARNING)
# Importing inductor imports torch/utils/mkldnn.py, whose classes still use the deprecated
# torch.jit.script_method decorator (an upstream import-time warning).
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_per_block_inductor_matches_eager():
    eager = tiny_gpt2()
    compiled = copy.deepcopy(eager)
    apply_compile(compiled, {"backend": "inductor", "per_block": True})
    batch = lm_batch()
    loss_eager, grads_eager = loss_and_grads(eager, batch)
    loss_compiled, grads_compiled = loss_and_grads(compiled, batch)
    torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-4, atol=1e-5)
    for g_compiled, g_eager in zip(grads_compiled, grads_eager):
        torch.testing.assert_close(g_compiled, g_eager, rtol=1e-3, atol=1e-5)
