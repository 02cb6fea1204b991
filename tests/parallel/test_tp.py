"""Tensor parallelism: TP=2 on 2 ranks and FSDP2 x TP (2 x 2) on 4 ranks train a small GPT-2
along the single-process loss curve; TP halves each rank's parameter bytes; a 2 x 2
sharded checkpoint resumes exactly and converts to a Hugging Face model with the
single-process logits; bad ``tp`` keys and plans are refused before anything is sharded."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

from cadence import Trainer, dist
from cadence.models.gpt import gpt2
from cadence.loggers import InMemoryLogger
from cadence.parallel.config import parse_parallelism_config
from cadence.parallel.memory import local_state_bytes
from cadence.parallel.tp import FusedQKVColwiseParallel, ReplicateParallel, plan_tensor_parallel
from tests.parallel.test_fsdp_parity import parity_tokens

STEPS = 10
GLOBAL_BATCH = 8
SEQ = 16
VOCAB = 64
# fp32. TP changes the order of the sums in the row-parallel matmuls (two partial sums
# all-reduced) and in the gradients; measured max |loss diff| (loss ~4): 4.8e-7 (TP=2, 10
# steps), 4.8e-7 (2 x 2, 10 steps), 2.4e-7 (2 x 2 with activation checkpointing, 5 steps;
# compiled, 3 steps), 4.8e-7 (2 x 2 with clipping, child tuning and EMA, 5 steps).
TOLERANCE = 5e-6
COMPILE_STEPS = 3  # compile is slow on CPU: fewer steps for the compiled variant
AC_STEPS = 5  # recomputation: fewer steps
ALGO_STEPS = 5
BF16_STEPS = 3
# amp_bf16 (FSDP2 gathers bf16 parameters, autocast computes in bf16) against the fp32
# reference: bf16 keeps 8 bits of mantissa, so only the first digits of the loss agree
# (measured 2.8e-3 over 3 steps).
BF16_TOLERANCE = 1e-2

TP2 = {"tp": {"tensor_parallel_degree": 2}}
FSDP_X_TP = {"fsdp": {}, "tp": {"tensor_parallel_degree": 2}}


def tiny_gpt2() -> Any:
    torch.manual_seed(0)
    return gpt2(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, max_seq_len=SEQ)


def make_trainer(parallelism_config: Optional[dict[str, Any]], steps: int = STEPS,
                 **kwargs: Any) -> tuple[Trainer, InMemoryLogger]:
    """A Trainer over the counting data; each data-parallel rank loads
    ``GLOBAL_BATCH / data-parallel size`` samples (``dist.get_sampler``'s defaults: the
    Trainer splits them over the data-parallel ranks only)."""
    model = tiny_gpt2()
    dataset = parity_tokens()
    tp = (parallelism_config or {}).get("tp", {}).get("tensor_parallel_degree", 1)
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH * tp // dist.get_world_size(),
                        sampler=dist.get_sampler(dataset, shuffle=False))
    memory = InMemoryLogger()
    trainer = Trainer(model=model, train_dataloader=loader, max_duration=f"{steps}ba",
                      optimizers=torch.optim.AdamW(model.parameters(), lr=1e-2),
                      loggers=[memory], log_interval="1ba", progress_bar=False, seed=0,
                      parallelism_config=parallelism_config, device="cpu", **kwargs)
    return trainer, memory


def train_losses(parallelism_config: Optional[dict[str, Any]], steps: int = STEPS,
                 **kwargs: Any) -> tuple[list[float], Trainer]:
    trainer, memory = make_trainer(parallelism_config, steps, **kwargs)
    trainer.fit()
    losses = [float(value) for _, value in memory.data["loss/train/total"]]
    assert len(losses) == steps
    return losses, trainer


def algorithms() -> list[Any]:
    """Gradient clipping by global norm (tight enough to clip every step), child tuning D
    (one Fisher threshold over every shard) and EMA: what must agree across TP x FSDP."""
    from cadence.algorithms import EMA, ChildTuning, GradientClipping

    return [GradientClipping(clipping_type="norm", clipping_threshold=0.05),
            ChildTuning(mode="D", reserve_p=0.3, fisher_batches=2), EMA(smoothing=0.9)]


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The single-process curves and byte counts (computed once, in this process)."""
    losses, trainer = train_losses(None)
    assert losses[-1] < losses[0]  # it learns
    algo_losses, algo_trainer = train_losses(None, ALGO_STEPS, algorithms=algorithms())
    assert algo_losses[:2] != losses[:2]  # clipping and masking changed the run
    return {"losses": losses, "algo_losses": algo_losses,
            "ema": _ema_sums(algo_trainer),
            "bytes": local_state_bytes(trainer.state.model, trainer.state.optimizer)}


def _ema_sums(trainer: Trainer) -> dict[str, float]:
    """Sum of each EMA weight (full tensors), to compare EMA across layouts."""
    from cadence.algorithms import EMA

    ema = next(a for a in trainer.state.algorithms if isinstance(a, EMA))
    return {k: float((v.full_tensor() if isinstance(v, DTensor) else v).double().sum())
            for k, v in ema.ema_weights.items()}


def _eval_logits(model: torch.nn.Module) -> torch.Tensor:
    """The model's logits ``[4, SEQ, VOCAB]`` for four counting sequences, in eval mode."""
    ids = parity_tokens().ids[:4]
    model.eval()
    with torch.no_grad():
        out = model({"input_ids": ids, "labels": ids})
    return out.logits if hasattr(out, "logits") else out["logits"]


def _record(what: str, worst: float) -> None:
    """Print the measured difference (``pytest -s``) so the tolerance can be restated."""
    if dist.get_global_rank() == 0:
        print(f"max |loss diff| {what}: {worst:.2e}", flush=True)


def _worst(losses: list[float], expected: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(losses, expected))


@pytest.mark.world_size(2)
def test_tp2_on_two_ranks(reference: dict[str, Any]) -> None:
    """TP=2 (one group of two ranks): the single-process loss curve, about half the bytes
    per rank; the built-in Llama plan gives the whole model's logits and gradients; and a
    plan that does not fit is refused by the Trainer before it shards."""
    losses, trainer = train_losses(TP2)
    worst = _worst(losses, reference["losses"])
    _record("tp2", worst)
    assert worst <= TOLERANCE, f"TP=2: max |loss diff| {worst:.2e} > {TOLERANCE}"
    model = trainer.state.model
    assert not isinstance(model, torch.nn.parallel.DistributedDataParallel)  # one TP group
    assert all(isinstance(p, DTensor) for p in model.parameters())
    c_fc = model.model.transformer.h[0].mlp.c_fc.weight
    assert tuple(c_fc.shape) == (32, 128) and tuple(c_fc.to_local().shape) == (32, 64)
    # both ranks of the TP group saw the whole global batch
    assert int(trainer.state.timestamp.sample) == STEPS * GLOBAL_BATCH
    mine = local_state_bytes(model, trainer.state.optimizer)
    for kind in ("params", "grads", "optimizer"):
        ratio = mine[kind] / reference["bytes"][kind]
        # embeddings, norms and the row-parallel biases stay whole: a little over half
        assert 0.5 <= ratio <= 0.58, f"{kind}: rank {dist.get_global_rank()} holds {ratio:.3f}"

    # the built-in Llama plan: the same logits and loss gradient as the whole model
    from cadence.parallel import ParallelPlan, parallelize

    whole, llama = tiny_llama(), tiny_llama()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # verbose: the mesh and the TP plan, rank 0
        llama = parallelize(llama, ParallelPlan(parse_parallelism_config(
            {"tp": {"tensor_parallel_degree": 2, "verbose": True}})))
    if dist.get_global_rank() == 0:
        text = printed.getvalue()
        assert "Parallelism: mesh (1, 2) ('dp_replicate', 'tp') on 2 ranks" in text
        assert "TP plan (built-in plan for LlamaDecoderLayer), tensor_parallel_degree=2, " \
               "7 modules:" in text
        assert "model.model.layers.0.mlp.down_proj" in text and "RowwiseParallel" in text
    else:
        assert printed.getvalue() == ""
    batch = {"input_ids": parity_tokens().ids[:2], "labels": parity_tokens().ids[:2]}
    assert isinstance(llama.model.model.layers[0].mlp.up_proj.weight, DTensor)
    out, ref = llama(batch), whole(batch)
    assert torch.allclose(out.logits, ref.logits, atol=1e-5)
    llama.loss(out, batch).backward()
    whole.loss(ref, batch).backward()
    grad = llama.model.model.layers[0].self_attn.q_proj.weight.grad.full_tensor()
    assert torch.allclose(grad, whole.model.model.layers[0].self_attn.q_proj.weight.grad,
                          atol=1e-6)

    bad = gpt2(n_layer=1, n_head=3, n_embd=24, vocab_size=VOCAB, max_seq_len=SEQ)
    with pytest.raises(ValueError, match="has 3 attention heads"):
        Trainer(model=bad, progress_bar=False, device="cpu", parallelism_config=TP2)
    assert not any(isinstance(p, DTensor) for p in bad.parameters())
    with pytest.raises(ValueError, match="tensor_parallel_degree=4 does not divide the world "
                                         "size 2"):
        Trainer(model=tiny_gpt2(), progress_bar=False, device="cpu",
                parallelism_config={"tp": {"tensor_parallel_degree": 4}})


@pytest.mark.world_size(4)
def test_fsdp_x_tp_2x2_matches_single_process(reference: dict[str, Any], tmp_path: Path) -> None:
    """FSDP2 x TP on a (dp_shard=2, tp=2) mesh: plain, with activation checkpointing (the
    fsdp key), compiled per block (``aot_eager``: the same tracing as inductor, no code
    generation, so the test stays short), with gradient clipping, child tuning and EMA, and
    in mixed precision (``amp_bf16``, loosely).
    The plain run writes sharded checkpoints: resuming from its step-2 checkpoint on 2 x 2
    reproduces steps 3 and 4 bit for bit, and ``cadence convert``'s Hugging Face export of
    its step-4 checkpoint gives the 2 x 2 model's logits."""
    from torch.distributed.fsdp import FSDPModule

    from cadence.parallel.activation_checkpointing import is_checkpointed
    from cadence.parallel.compile import is_compiled

    variants: dict[str, tuple[dict[str, Any], dict[str, Any], int]] = {
        "plain": ({}, {"save_folder": str(tmp_path), "save_interval": "2ba",
                       "run_name": "tp-run"}, STEPS),
        "activation_checkpointing": ({"activation_checkpointing": True}, {}, AC_STEPS),
        "compile": ({}, {"compile_config": {"backend": "aot_eager"}}, COMPILE_STEPS),
        "clipping+child_tuning+ema": ({}, {"algorithms": algorithms()}, ALGO_STEPS),
        "amp_bf16": ({}, {"precision": "amp_bf16"}, BF16_STEPS),
    }
    curves = {}
    for variant, (fsdp, kwargs, steps) in variants.items():
        config = {"fsdp": fsdp, "tp": {"tensor_parallel_degree": 2}}
        losses, trainer = train_losses(config, steps, **kwargs)
        curves[variant] = losses
        trainer.close()
        expected = reference["algo_losses" if "algorithms" in kwargs else "losses"][:steps]
        worst = _worst(losses, expected)
        _record(f"2x2 {variant}", worst)
        if "algorithms" in kwargs:
            sums = _ema_sums(trainer)
            assert sums.keys() == reference["ema"].keys()
            worst_ema = max(abs(sums[k] - reference["ema"][k]) for k in sums)
            assert worst_ema <= 1e-4, f"EMA weights differ by {worst_ema:.2e}"
        tolerance = BF16_TOLERANCE if variant == "amp_bf16" else TOLERANCE
        assert worst <= tolerance, f"2x2 {variant}: max |loss diff| {worst:.2e} > {tolerance}"
        model = trainer.state.model
        assert isinstance(model, FSDPModule)
        weight = model.model.transformer.h[0].attn.c_attn.weight
        assert weight.device_mesh.mesh_dim_names == ("dp_shard", "tp")
        assert tuple(weight.device_mesh.shape) == (2, 2)
        assert int(trainer.state.timestamp.sample) == steps * GLOBAL_BATCH
        blocks = list(model.model.transformer.h)
        assert all(is_checkpointed(b) for b in blocks) == (variant == "activation_checkpointing")
        assert all(is_compiled(b) for b in blocks) == (variant == "compile")
    _check_resume_and_convert(tmp_path, curves["plain"])


def _check_resume_and_convert(folder: Path, straight: list[float]) -> None:
    """Resume the plain 2 x 2 run from its step-2 sharded checkpoint; convert step 4."""
    step2 = sorted(folder.glob("*ba2*"))
    assert step2, f"no step-2 checkpoint in {sorted(p.name for p in folder.iterdir())}"
    resumed, memory = make_trainer(FSDP_X_TP, steps=4, load_path=str(step2[0]))
    resumed.fit()
    losses = [float(v) for _, v in memory.data["loss/train/total"]]
    assert losses == straight[2:4], f"resumed {losses} != uninterrupted {straight[2:4]}"
    logits = _eval_logits(resumed.state.model)
    resumed.close()
    step4 = sorted(folder.glob("*ba4*"))
    assert step4
    dist.barrier()
    if dist.get_global_rank() == 0:
        from transformers import GPT2LMHeadModel

        from cadence.models.hf_export import to_huggingface

        out = to_huggingface(step4[0], folder / "hf")
        hf = GPT2LMHeadModel.from_pretrained(str(out)).eval()
        ids = parity_tokens().ids[:4]
        with torch.no_grad():
            hf_logits = hf(input_ids=ids).logits
        assert torch.allclose(hf_logits, logits, atol=1e-5), \
            float((hf_logits - logits).abs().max())
    dist.barrier()


def test_bad_tp_keys_are_refused_with_the_key_named() -> None:
    with pytest.raises(ValueError) as info:
        parse_parallelism_config({"tp": {"tensor_paralel_degree": 2, "layer_plan": {
            "model.transformer.h.*.mlp.c_fc": "colwize"}, "device_mesh": None}})
    message = str(info.value)
    assert "parallelism_config.tp.tensor_paralel_degree: unknown TP key. Did you mean " \
           "'tensor_parallel_degree'?" in message
    assert "parallelism_config.tp.layer_plan.model.transformer.h.*.mlp.c_fc: 'colwize' is " \
           "not a style. Did you mean 'colwise'?" in message
    assert "parallelism_config.tp.device_mesh: not supported" in message
    with pytest.raises(ValueError, match=r"tp.tensor_parallel_degree: 0 must be a positive int"):
        parse_parallelism_config({"tp": {"tensor_parallel_degree": 0}})
    with pytest.raises(ValueError, match=r"tp.layer_plan: \[\] must be a non-empty dict"):
        parse_parallelism_config({"tp": {"layer_plan": []}})


def test_style_names_and_paths_resolve_in_one_place() -> None:
    """The run-file check and the TP step read styles through one resolver."""
    from cadence.parallel.tp_styles import resolve_tp_style, tp_style_problem

    assert resolve_tp_style("colwise") == resolve_tp_style("ColwiseParallel") == "colwise"
    assert resolve_tp_style("cadence.parallel.tp.FusedQKVColwiseParallel") \
        is FusedQKVColwiseParallel
    with pytest.raises(ValueError, match=r"'rowwize' is not a style. Did you mean 'rowwise'\?"):
        resolve_tp_style("rowwize")
    with pytest.raises(ValueError, match=r"'torch.nn.Linear' is not a ParallelStyle class"):
        resolve_tp_style("torch.nn.Linear")
    assert tp_style_problem("mypkg.Nope", import_paths=False) is None  # left to stage 2
    assert "cannot import 'mypkg.Nope'" in str(tp_style_problem("mypkg.Nope"))
    model = gpt2(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB, max_seq_len=SEQ)
    plan = plan_tensor_parallel(model, 2, {
        "model.transformer.h.*.mlp.c_fc": "cadence.parallel.tp.ReplicateParallel"})
    assert [type(e.style) for e in plan.entries] == [ReplicateParallel]


def test_bad_plans_are_refused_before_sharding_naming_the_module() -> None:
    model = gpt2(n_layer=1, n_head=3, n_embd=24, vocab_size=VOCAB, max_seq_len=SEQ)
    before = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(ValueError) as info:
        plan_tensor_parallel(model, 2)  # 3 heads over 2 ranks
    assert "module 'model.transformer.h.0.attn' (GPT2Attention) has 3 attention heads, which " \
           "tensor_parallel_degree 2 does not divide" in str(info.value)
    with pytest.raises(ValueError) as info:
        plan_tensor_parallel(model, 2, {"model.transformer.h.*.ln_1": "colwise",
                                        "model.transformer.blocks.*.mlp": "rowwise"})
    message = str(info.value)
    assert "module 'model.transformer.h.0.ln_1' is a LayerNorm; colwise shards nn.Linear" \
           in message
    assert "pattern 'model.transformer.blocks.*.mlp' (parallelism_config.tp.layer_plan) " \
           "matches no module of HuggingFaceModel" in message
    with pytest.raises(ValueError, match="no tensor-parallel plan for Sequential"):
        plan_tensor_parallel(torch.nn.Sequential(torch.nn.Linear(4, 4)), 2)
    # nothing was sharded or changed
    assert all(not isinstance(p, DTensor) and torch.equal(p, before[n])
               for n, p in model.named_parameters())


def tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    from cadence.models import HuggingFaceModel

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=SEQ)
    return HuggingFaceModel(LlamaForCausalLM(config))


def test_plan_sources_llama_builtin_model_hook_and_layer_plan() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = plan_tensor_parallel(tiny_llama(), 2)
    assert plan.source == "built-in plan for LlamaDecoderLayer"
    styles = {e.name.rsplit(".", 2)[-2] + "." + e.name.rsplit(".", 1)[-1]: type(e.style)
              for e in plan.entries}
    assert styles == {"self_attn.q_proj": ColwiseParallel, "self_attn.k_proj": ColwiseParallel,
                      "self_attn.v_proj": ColwiseParallel, "self_attn.o_proj": RowwiseParallel,
                      "mlp.gate_proj": ColwiseParallel, "mlp.up_proj": ColwiseParallel,
                      "mlp.down_proj": RowwiseParallel}
    with pytest.raises(ValueError, match="has num_key_value_heads=2, which "
                                         "tensor_parallel_degree 4 does not divide"):
        plan_tensor_parallel(tiny_llama(), 4)

    class WithHook(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                           torch.nn.Linear(8, 4))

        def tp_plan(self) -> dict[str, str]:
            return {"net.0": "colwise", "net.2": "rowwise"}

    hooked = plan_tensor_parallel(WithHook(), 2)
    assert hooked.source == "WithHook.tp_plan()"
    assert [(e.name, type(e.style)) for e in hooked.entries] == [
        ("net.0", ColwiseParallel), ("net.2", RowwiseParallel)]
    # an explicit layer_plan wins over the hook
    explicit = plan_tensor_parallel(WithHook(), 2, {"net.*": "replicate"})
    assert explicit.source == "parallelism_config.tp.layer_plan"
    assert [e.name for e in explicit.entries] == ["net.0", "net.1", "net.2"]


def test_global_batch_splits_over_data_parallel_ranks() -> None:
    """With TP, ``global_train_batch_size`` divides over ``world / tensor_parallel_degree``."""
    from cadence.config.load import ConfigError, load_config

    run = {"max_duration": "1ba", "global_train_batch_size": 2,
           "model": {"name": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16,
                     "vocab_size": 32, "max_seq_len": 8},
           "train_loader": {"name": "tests.common.models.make_dataloader"},
           "parallelism_config": {"fsdp": {}, "tp": {"tensor_parallel_degree": 2}}}
    load_config(run, world_size=4)  # 2 data-parallel ranks: 1 sample each
    with pytest.raises(ConfigError, match="2 does not divide evenly over 4 ranks"):
        load_config({**run, "parallelism_config": {"fsdp": {}}}, world_size=4)
