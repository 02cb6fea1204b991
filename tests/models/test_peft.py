"""LoRA through ``peft``: ``HuggingFaceModel(peft_config=...)``, ``hf_pretrained``'s ``peft``,
trainable-only optimizer, adapter-only checkpoints (size, exact resume, base identity) and
FSDP2 on two gloo ranks."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

pytest.importorskip("peft")

from peft import LoraConfig  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from cadence import Trainer, dist  # noqa: E402
from cadence.checkpoint import CheckpointError  # noqa: E402
from cadence.loggers import InMemoryLogger  # noqa: E402
from cadence.models import HuggingFaceModel  # noqa: E402
from tests.common.events import StopAt  # noqa: E402

VOCAB, SEQ, GLOBAL_BATCH, BATCHES_PER_EPOCH = 64, 12, 4, 4


def base_model(seed: int = 0, n_embd: int = 256, dropout: float = 0.1) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=n_embd, n_layer=2, n_head=2,
                        use_cache=False, bos_token_id=None, eos_token_id=None,
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def lora(dropout: float = 0.1) -> LoraConfig:
    # GPT-2's attention is a Conv1D (weights stored transposed): fan_in_fan_out
    return LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=dropout,
                      fan_in_fan_out=True, task_type="CAUSAL_LM")


def lora_model(seed: int = 0, dropout: float = 0.1, save_peft_only: bool = True,
               adapter_seed: int = 1) -> HuggingFaceModel:
    base = base_model(seed, dropout=dropout)
    torch.manual_seed(adapter_seed)
    return HuggingFaceModel(base, peft_config=lora(dropout),
                            should_save_peft_only=save_peft_only)


class Counting(Dataset):
    """Sequences whose next token is the last + 1 (mod ``VOCAB``)."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(7)
        starts = torch.randint(0, VOCAB, (BATCHES_PER_EPOCH * GLOBAL_BATCH, 1), generator=gen)
        self.ids = (starts + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def run(folder: Path, model: HuggingFaceModel, stop_at: Optional[int] = None,
        autoresume: bool = False, fmt: str = "full", fsdp: bool = False,
        max_duration: str = "8ba", tp_plan: Optional[dict[str, str]] = None,
        **trainer_kwargs: Any) -> tuple[dict[int, float], Trainer]:
    data = Counting()
    tp = 2 if tp_plan else 1  # a TP pair shares its batch
    loader = DataLoader(data, batch_size=GLOBAL_BATCH * tp // dist.get_world_size(),
                        sampler=dist.get_sampler(data, shuffle=True, seed=3, drop_last=True))
    parallelism: Any = {"fsdp": {"state_dict_type": fmt}} if fsdp else {}
    if tp_plan:
        parallelism["tp"] = {"tensor_parallel_degree": tp, "layer_plan": tp_plan}
    parallelism = trainer_kwargs.pop("parallelism_config", parallelism or None)
    memory = InMemoryLogger()
    trainer = Trainer(
        model=model, train_dataloader=loader, max_duration=max_duration, seed=11,
        device_train_microbatch_size=1, loggers=[memory], log_interval="1ba",
        callbacks=[] if stop_at is None else [StopAt(stop_at)], progress_bar=False,
        run_name="lora", save_folder=str(folder), save_interval="100ba",
        save_state_dict_type=fmt, autoresume=autoresume,
        parallelism_config=parallelism, **trainer_kwargs,
    )
    trainer.fit()
    trainer.close()
    return dict(zip(*memory.steps_and_values("loss/train/total"))), trainer


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() \
        else path.stat().st_size


def test_lora_freezes_the_base_and_the_optimizer_sees_only_adapters(tmp_path: Path) -> None:
    model = lora_model()
    assert model.uses_peft and model.saves_adapters_only
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert model.peft_base is not None and model.peft_base["crc32c"] is not None
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters()
                     if not p.requires_grad}
    _, trainer = run(tmp_path, model, max_duration="3ba")
    optimized = [p for group in trainer.state.optimizers[0].param_groups for p in group["params"]]
    assert len(optimized) == len(trainable) and all(p.requires_grad for p in optimized)
    for name, param in model.named_parameters():  # the base is bit-identical after training
        if name in frozen_before:
            assert torch.equal(param, frozen_before[name]), name


def test_missing_peft_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ImportError, match=r"pip install 'cadence\[peft\]'"):
        HuggingFaceModel(base_model(), peft_config={"peft_type": "LORA", "r": 4})


def test_run_file_peft_key_refused_at_value_stage(tmp_path: Path) -> None:
    from cadence.registry.arg_checks import check_arg_values
    from cadence.models.gpt import hf_pretrained

    problems = check_arg_values(hf_pretrained, {
        "pretrained_model_name_or_path": str(tmp_path),
        "peft": {"peft_type": "LORA", "r": 8, "lora_alpah": 16}})
    assert len(problems) == 1 and problems[0][0] == "peft"
    assert "lora_alpah" in problems[0][1] and "lora_alpha" in problems[0][1]
    problems = check_arg_values(hf_pretrained, {
        "pretrained_model_name_or_path": str(tmp_path), "peft": {"peft_type": "PREFIX"}})
    assert "PREFIX" in problems[0][1]


def test_hf_pretrained_with_peft_records_the_base_directory(tmp_path: Path) -> None:
    from cadence.models.gpt import hf_pretrained

    base_model().save_pretrained(tmp_path / "base")
    model = hf_pretrained(tmp_path / "base", init_device="meta", peft={
        "peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["c_attn"],
        "lora_dropout": 0.05, "fan_in_fan_out": True})
    assert model.uses_peft and model.peft_base["over"] == "tensors and config"
    assert model.peft_base["name_or_path"] == str(tmp_path / "base")
    assert not any(p.is_meta for p in model.parameters())


def test_the_base_identity_is_what_the_loader_reads(tmp_path: Path) -> None:
    """The identity covers the tensors the index points to (names, dtypes, shapes, bytes)
    and config.json: re-sharding the same weights or a stray ``*.safetensors`` file keeps
    it; a changed config value or tensor changes it, named; an index entry outside the
    folder is refused."""
    import shutil

    from safetensors.torch import save_file

    from cadence.checkpoint.adapter_only import base_difference
    from cadence.models.peft import base_identity
    from cadence.parallel.hf_weights import WeightFileError

    model = base_model(n_embd=32)
    model.save_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    one = base_identity(model, str(tmp_path / "one"))
    assert one["over"] == "tensors and config"
    assert base_difference(one, base_identity(model, str(tmp_path / "sharded"))) is None
    save_file({"stray": torch.zeros(2)}, tmp_path / "sharded" / "stray.safetensors")
    assert base_difference(one, base_identity(model, str(tmp_path / "sharded"))) is None
    shutil.copytree(tmp_path / "one", tmp_path / "eps")
    config = json.loads((tmp_path / "eps" / "config.json").read_text())
    config["layer_norm_epsilon"] = 10.0
    (tmp_path / "eps" / "config.json").write_text(json.dumps(config))
    assert "'layer_norm_epsilon' is 10.0" in base_difference(
        one, base_identity(model, str(tmp_path / "eps")))
    other = base_model(seed=3, n_embd=32)
    other.save_pretrained(tmp_path / "other")
    assert "tensor 'transformer." in str(base_difference(
        one, base_identity(other, str(tmp_path / "other"))))
    index_path = tmp_path / "sharded" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = sorted(index["weight_map"])[0]
    index["weight_map"][first] = str(tmp_path / "other" / "model.safetensors")
    index_path.write_text(json.dumps(index))
    with pytest.raises(WeightFileError, match="outside the model folder"):
        base_identity(model, str(tmp_path / "sharded"))


def test_hf_pretrained_classifier_with_peft_trains_its_new_head(tmp_path: Path) -> None:
    """``task: sequence_classification`` gives peft ``SEQ_CLS``: the new head trains with the
    adapters (under ``CAUSAL_LM`` it would stay frozen at its random initialisation)."""
    from transformers import GPT2ForSequenceClassification

    from cadence.models.gpt import hf_pretrained

    torch.manual_seed(0)
    config = base_model().config
    config.num_labels = 3
    GPT2ForSequenceClassification(config).save_pretrained(tmp_path / "base")
    spec = {"peft_type": "LORA", "r": 4, "target_modules": ["c_attn"], "fan_in_fan_out": True}
    model = hf_pretrained(tmp_path / "base", task="sequence_classification", num_labels=3,
                          peft=spec)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any("score" in n for n in trainable), trainable
    assert all("lora_" in n or "score" in n for n in trainable), trainable
    with pytest.raises(ValueError, match=r"peft.task_type='CAUSAL_LM' does not fit "
                                         r"task='sequence_classification'; use task_type: SEQ_CLS"):
        hf_pretrained(tmp_path / "base", task="sequence_classification", num_labels=3,
                      peft={**spec, "task_type": "CAUSAL_LM"})


def test_child_tuning_refuses_peft(tmp_path: Path) -> None:
    from cadence.algorithms.child_tuning import ChildTuning

    with pytest.raises(ValueError, match="ChildTuning cannot train a peft model"):
        Trainer(model=lora_model(), train_dataloader=DataLoader(Counting(), batch_size=4),
                max_duration="1ba", algorithms=[ChildTuning(mode="F")], progress_bar=False)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_adapter_only_checkpoint_resumes_exactly_and_is_small(tmp_path: Path, fmt: str) -> None:
    whole, _ = run(tmp_path / "a", lora_model(), fmt=fmt)
    first, _ = run(tmp_path / "b", lora_model(), stop_at=3, fmt=fmt)
    checkpoint = next(p for p in (tmp_path / "b").iterdir() if p.name.startswith("ep"))
    resumed, trainer = run(tmp_path / "b", lora_model(), autoresume=True, fmt=fmt)
    assert min(resumed) == 4 and trainer.state.timestamp.batch == 8
    for step in range(1, 9):
        got = first[step] if step <= 3 else resumed[step]
        assert got == whole[step], f"step {step}: {got!r} != {whole[step]!r} (bit-exact)"
    run(tmp_path / "c", lora_model(save_peft_only=False), stop_at=3, fmt=fmt)
    full = next(p for p in (tmp_path / "c").iterdir() if p.name.startswith("ep"))
    print(f"{fmt}: adapter-only {size(checkpoint)} B, full {size(full)} B")
    assert size(checkpoint) < 0.05 * size(full)
    if fmt == "full":  # the tied lm_head.weight (an alias of the frozen wte) is left out too
        saved = torch.load(checkpoint, weights_only=True)["state"]["model"]
        assert saved and all("lora_" in key for key in saved), sorted(saved)
    else:
        from torch.distributed.checkpoint import FileSystemReader
        keys = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
        model_keys = [k for k in keys if k.startswith("model.")]
        assert model_keys and all("lora_" in k for k in model_keys), model_keys


def test_resume_onto_another_base_is_refused(tmp_path: Path) -> None:
    run(tmp_path, lora_model(seed=0), stop_at=2)
    checkpoint = next(p for p in tmp_path.iterdir() if p.name.startswith("ep"))
    saved = lora_model(seed=0).peft_base["crc32c"]
    other = lora_model(seed=5)
    with pytest.raises(CheckpointError) as err:
        Trainer(model=other, train_dataloader=DataLoader(Counting(), batch_size=4),
                max_duration="4ba", load_path=str(checkpoint), progress_bar=False)
    message = str(err.value)
    assert saved in message and other.peft_base["crc32c"] in message
    assert "adapters trained on the base" in message


def test_resume_with_another_adapter_config_is_refused(tmp_path: Path) -> None:
    """The checkpoint records the adapter's peft config: a resume whose config differs
    (``lora_alpha`` 8 -> 64: same shapes, another scale) is refused, naming the key and
    both values."""
    run(tmp_path, lora_model(seed=0), stop_at=2)
    checkpoint = next(p for p in tmp_path.iterdir() if p.name.startswith("ep"))
    base = base_model(0)
    torch.manual_seed(1)
    config = LoraConfig(r=4, lora_alpha=64, target_modules=["c_attn"], lora_dropout=0.1,
                        fan_in_fan_out=True, task_type="CAUSAL_LM")
    other = HuggingFaceModel(base, peft_config=config, should_save_peft_only=True)
    with pytest.raises(CheckpointError, match=r"lora_alpha.*8.*64"):
        Trainer(model=other, train_dataloader=DataLoader(Counting(), batch_size=4),
                max_duration="4ba", load_path=str(checkpoint), progress_bar=False)


def _two_ranks(folder: str) -> None:
    """LoRA under FSDP2: the base sharded and frozen, adapters trained, adapter-only sharded
    checkpoint resumed exactly."""
    from torch.distributed.tensor import DTensor

    root = Path(folder)
    model = lora_model(dropout=0.0)
    losses, trainer = run(root / "whole", model, fmt="sharded", fsdp=True)
    base = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    assert base and all(isinstance(p, DTensor) for p in base.values())
    reference = lora_model(dropout=0.0)  # same seeds: the base it started from
    for name, param in reference.named_parameters():
        if not param.requires_grad:
            assert torch.equal(base[name].full_tensor(), param), name
    run(root / "b", lora_model(dropout=0.0), stop_at=3, fmt="sharded", fsdp=True)
    resumed, _ = run(root / "b", lora_model(dropout=0.0), autoresume=True, fmt="sharded",
                     fsdp=True)
    assert all(resumed[s] == losses[s] for s in range(4, 9)), (resumed, losses)
    if dist.get_global_rank() == 0:
        (root / "losses.json").write_text(json.dumps({str(k): v for k, v in losses.items()}))


def test_lora_fsdp_two_ranks_matches_one_process(tmp_path: Path) -> None:
    from tests.common.distributed import run_in_processes

    run_in_processes(2, __file__, "_two_ranks", {"folder": str(tmp_path)})
    two: dict[str, Any] = json.loads((tmp_path / "losses.json").read_text())
    one, _ = run(tmp_path / "one", lora_model(dropout=0.0))
    for step, loss in one.items():
        assert abs(two[str(step)] - loss) < 1e-5, (step, two[str(step)], loss)


def test_tensor_parallel_plan_refuses_adapter_layers_naming_them() -> None:
    """GPT-2's built-in plan splits ``attn.c_attn``, which LoRA wrapped: refused, naming the
    module, the reason and the two ways out."""
    from cadence.parallel.tp import plan_tensor_parallel

    with pytest.raises(ValueError) as err:
        plan_tensor_parallel(lora_model(), 2)
    message = str(err.value)
    assert "'model.base_model.model.transformer.h.0.attn.c_attn' is a peft adapter layer" \
        in message and "around a Conv1D" in message
    assert "layer_plan" in message and "target_modules" in message
    assert "h.0.mlp.c_fc" not in message  # modules without adapters are fine


#: the MLP split over the TP pair; LoRA (on ``attn.c_attn``) stays out of the plan
MLP_PLAN = {"model.base_model.model.transformer.h.*.mlp.c_fc": "colwise",
            "model.base_model.model.transformer.h.*.mlp.c_proj": "rowwise"}


def _tp_ranks(folder: str, fsdp: bool) -> None:
    from torch.distributed.tensor import DTensor

    model = lora_model(dropout=0.0)
    losses, _ = run(Path(folder) / "tp", model, tp_plan=MLP_PLAN, fsdp=fsdp)
    c_fc = dict(model.named_parameters())["model.base_model.model.transformer.h.0.mlp.c_fc.weight"]
    assert isinstance(c_fc, DTensor)
    assert c_fc.to_local().numel() * dist.get_world_size() == c_fc.numel()  # split over all
    if dist.get_global_rank() == 0:
        (Path(folder) / "tp_losses.json").write_text(json.dumps(losses))


@pytest.mark.slow
@pytest.mark.parametrize("ranks,fsdp", [(2, False), (4, True)], ids=["tp2", "fsdp2xtp2"])
def test_lora_with_tensor_parallel_mlp_matches_one_process(tmp_path: Path, ranks: int,
                                                           fsdp: bool) -> None:
    """Tensor parallelism where peft's layers allow it: the MLP split over a TP pair (under
    FSDP2 on 2 x 2 ranks too), LoRA on the attention; the loss curve is the one process's
    (float tolerance)."""
    from tests.common.distributed import run_in_processes

    run_in_processes(ranks, __file__, "_tp_ranks", {"folder": str(tmp_path), "fsdp": fsdp})
    many = json.loads((tmp_path / "tp_losses.json").read_text())
    one, _ = run(tmp_path / "one", lora_model(dropout=0.0))
    assert len(one) == 8
    for step, loss in one.items():
        assert abs(many[str(step)] - loss) < 1e-5, (step, many[str(step)], loss)


# Dynamo reads `.grad` of non-leaf activations while tracing (see tests/parallel/test_compile.py)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_lora_with_activation_checkpointing_and_compile_gives_the_same_losses(
        tmp_path: Path) -> None:
    """Both wrap the blocks around peft's layers: the adapters still train, the base stays
    bit-identical, and the losses are the plain run's (float tolerance)."""
    from cadence.algorithms import ActivationCheckpointing
    from cadence.algorithms.activation_checkpointing import is_checkpointed
    from cadence.parallel.compile import is_compiled

    plain, _ = run(tmp_path / "plain", lora_model(dropout=0.0))
    model = lora_model(dropout=0.0)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    wrapped, trainer = run(tmp_path / "wrapped", model, algorithms=[ActivationCheckpointing()],
                           compile_config={"backend": "aot_eager"})
    blocks = [m for m in trainer.state.model.modules() if type(m).__name__ == "GPT2Block"]
    assert blocks and all(is_checkpointed(b) or is_compiled(b) for b in blocks)
    assert any(is_checkpointed(m) for m in trainer.state.model.modules())
    assert any(is_compiled(m) for m in trainer.state.model.modules())
    for step, loss in plain.items():
        assert abs(wrapped[step] - loss) < 1e-5, (step, wrapped[step], loss)
    assert wrapped[8] < wrapped[1]  # the adapters learned
    for name, param in model.named_parameters():
        if name in frozen:
            assert torch.equal(param, frozen[name]), name


def test_lora_with_ema_and_clipping_touches_only_the_adapters(tmp_path: Path) -> None:
    """EMA averages (and checkpoints) the adapters only; clipping sees their gradients only;
    the base is bit-identical after the EMA swaps its weights in for evaluation and back."""
    from cadence.algorithms import EMA, GradientClipping

    model = lora_model()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    ema = EMA(half_life="2ba")
    run(tmp_path, model, algorithms=[ema, GradientClipping("norm", 1e-3)])
    averaged = set(ema.state_dict()["shadow"])  # trainable parameters and float buffers
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable <= averaged and not averaged & set(frozen), sorted(averaged & set(frozen))
    for name, param in model.named_parameters():
        if name in frozen:
            assert torch.equal(param, frozen[name]), name
