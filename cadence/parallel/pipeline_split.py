"""Splitting a model into pipeline stages, by module names, without copying it.

A split is a :class:`PipelineSplit`: one ``nn.Module`` per stage, each holding (not
copying) the model's own submodules, so a stage's parameters keep the model's names and
the model, once the modules of other ranks' stages are dropped
(:func:`cadence.parallel.pipeline.keep_local_modules`), checkpoints under its usual names.

Where the stages come from, first match wins:

1. the model's ``pipeline_split(num_stages, split_points)`` hook: returns a
   :class:`PipelineSplit` or a list of ``num_stages`` modules (stage ``0`` takes the tensor
   :func:`default_inputs` picks from a batch; the last stage's output is what the model's
   ``loss(outputs, microbatch)`` takes);
2. a Hugging Face causal LM inside a ``HuggingFaceModel`` (the built-in ``gpt2``, any
   ``GPT2LMHeadModel``, and the ``model.layers`` decoders: Llama, Mistral, Qwen2/3): its
   blocks split evenly (the first ``n % s`` stages take one block more), or at
   ``split_points``; stage 0 also holds the embeddings, the last stage the final norm and
   the output projection.

Under a pipeline the stages pass hidden states ``[batch, seq, d_model]`` and no padding
mask: attention is causal only (pack sequences, or right-pad with labels ``-100``).

Source: torchtitan's manual split (``torchtitan/distributed/pipeline_parallel.py``,
``pipeline_module_split``), which deep-copies the model per stage; here the stages share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from torch import nn

from cadence.registry.errors import did_you_mean

__all__ = ["PipelineSplit", "split_model", "stage_block_ranges", "default_inputs",
           "DecoderStage"]

_KEY = "parallelism_config.pp"


def default_inputs(batch: Any) -> torch.Tensor:
    """The first stage's input: ``batch["input_ids"]`` for a dict batch, else its first
    element (``(x, y)``), else the batch itself.

    Raises:
        ValueError: a dict batch without ``input_ids``.
    """
    if isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise ValueError(f"Under pipeline parallelism the first stage takes "
                             f"batch['input_ids']; the batch has {sorted(batch)}.")
        return batch["input_ids"]
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch


def _identity_outputs(output: Any, microbatch: Any) -> Any:
    del microbatch
    return output


@dataclass
class PipelineSplit:
    """A model split into stages.

    Attributes:
        stages: every stage's module, in pipeline order (each holds the model's own
            submodules; nothing is copied).
        inputs: the first stage's input tensor ``[batch, ...]`` from a batch (split into
            microbatches along dimension 0).
        outputs: the model's outputs (what its ``loss(outputs, microbatch)`` takes) from the
            last stage's output and its microbatch.
    """

    stages: list[nn.Module]
    inputs: Callable[[Any], torch.Tensor] = default_inputs
    outputs: Callable[[Any, Any], Any] = _identity_outputs


def stage_block_ranges(block_names: Sequence[str], num_stages: int,
                       split_points: Optional[Sequence[str]] = None) -> list[range]:
    """Which blocks each stage holds: ``num_stages`` consecutive, non-empty ranges of indices
    into ``block_names``.

    Args:
        block_names: the blocks' module names, in model order (``model.transformer.h.0``).
        num_stages: stages of the whole pipeline.
        split_points: names of the blocks where stages 1, 2, ... begin; default an even split
            (the first ``len % num_stages`` stages take one block more).

    Raises:
        ValueError: more stages than blocks, a split point that names no block, or split
            points out of model order (naming them).
    """
    count = len(block_names)
    if num_stages > count:
        raise ValueError(f"{_KEY}: {num_stages} stages (pipeline_parallel_degree x "
                         f"stages_per_rank) but the model has {count} blocks "
                         f"({block_names[0] if count else 'none'} ...); use at most {count} "
                         f"stages.")
    if split_points is None:
        base, extra = divmod(count, num_stages)
        starts = [0]
        for stage in range(num_stages - 1):
            starts.append(starts[-1] + base + (1 if stage < extra else 0))
    else:
        if len(split_points) != num_stages - 1:
            raise ValueError(f"{_KEY}.split_points: {len(split_points)} split point(s) for "
                             f"{num_stages} stages; give {num_stages - 1}.")
        index = {name: i for i, name in enumerate(block_names)}
        starts = [0]
        for point in split_points:
            if point not in index:
                raise ValueError(
                    f"{_KEY}.split_points: {point!r} matches no block of the model."
                    f"{did_you_mean(point, block_names)} The blocks are {block_names[0]} ... "
                    f"{block_names[-1]}.")
            if index[point] <= starts[-1]:
                raise ValueError(f"{_KEY}.split_points: {point!r} does not come after the "
                                 f"previous stage's first block; list them in model order, "
                                 f"without {block_names[0]}.")
            starts.append(index[point])
    ends = [*starts[1:], count]
    return [range(a, b) for a, b in zip(starts, ends)]


_DELEGATED = frozenset({"fsdp_wrap_fn", "activation_checkpointing_fn", "tp_plan",
                        "transformer_layer_classes"})


class DecoderStage(nn.Module):
    """One stage of a Hugging Face causal LM: the embeddings (stage 0), some blocks, the final
    norm and output projection (last stage), all the model's own modules.

    Shapes: stage 0 takes ``input_ids [batch, seq]``; the others take hidden states
    ``[batch, seq, d_model]``; the last returns logits ``[batch, seq, vocab]``, the others
    hidden states. The parallelize plan's model hooks (``fsdp_wrap_fn``,
    ``activation_checkpointing_fn``, ``tp_plan``) are the owner model's.

    Args:
        owner: the ``ComposerModel`` the modules belong to (not registered as a submodule).
        hf: the Hugging Face model (its ``config``).
        family: ``"gpt2"`` or ``"decoder"`` (``model.layers`` with rotary embeddings).
        blocks: ``{index: block}`` for this stage (indices as in the model's block list).
        first / last: whether the stage holds the embeddings / the head.
    """

    def __init__(self, owner: nn.Module, hf: nn.Module, family: str,
                 blocks: dict[int, nn.Module], first: bool, last: bool) -> None:
        super().__init__()
        self.__dict__["_owner"] = owner  # a plain reference: not a submodule
        self.__dict__["_config"] = hf.config
        self.family, self.first, self.last = family, first, last
        base = hf.transformer if family == "gpt2" else hf.model
        if first:
            if family == "gpt2":
                self.wte, self.wpe, self.drop = base.wte, base.wpe, base.drop
            else:
                self.embed_tokens = base.embed_tokens
        if family == "decoder":
            self.rotary_emb = base.rotary_emb
        self.blocks = nn.ModuleDict({str(i): block for i, block in blocks.items()})
        if last:
            self.norm = base.ln_f if family == "gpt2" else base.norm
            self.lm_head = hf.lm_head

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in _DELEGATED:
                return getattr(self.__dict__["_owner"], name)
            raise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the stage; see the class docstring for the shapes."""
        from transformers.masking_utils import create_causal_mask

        if self.first:
            positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            if self.family == "gpt2":
                x = self.drop(self.wte(x) + self.wpe(positions))
            else:
                x = self.embed_tokens(x)
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        mask = create_causal_mask(config=self._config, inputs_embeds=x, attention_mask=None,
                                  cache=None, position_ids=positions)
        if self.family == "gpt2":
            for block in self.blocks.values():
                x = block(x, None, mask, None, use_cache=False, position_ids=positions)
        else:
            rotary = self.rotary_emb(x, position_ids=positions)
            for block in self.blocks.values():
                x = block(x, attention_mask=mask, position_embeddings=rotary,
                          position_ids=positions, use_cache=False)
        if self.last:
            x = self.lm_head(self.norm(x))
        return x


def _hf_family(hf: nn.Module) -> Optional[str]:
    base = getattr(hf, "transformer", None)
    if base is not None and hasattr(base, "h") and hasattr(base, "wte") \
            and hasattr(hf, "lm_head"):
        return "gpt2"
    base = getattr(hf, "model", None)
    if base is not None and all(hasattr(base, a) for a in ("layers", "embed_tokens", "norm",
                                                           "rotary_emb")) \
            and hasattr(hf, "lm_head"):
        return "decoder"
    return None


def _causal_lm_outputs(hf: nn.Module) -> Callable[[Any, Any], Any]:
    """The last stage's logits as the model's outputs, with its own loss (index labels)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    def outputs(logits: torch.Tensor, microbatch: Any) -> Any:
        labels = microbatch.get("labels") if isinstance(microbatch, Mapping) else None
        loss = None
        if isinstance(labels, torch.Tensor) and not labels.is_floating_point():
            extra = ({"num_items_in_batch": microbatch["num_items_in_batch"]}
                     if "num_items_in_batch" in microbatch else {})
            loss = hf.loss_function(logits, labels, vocab_size=hf.config.vocab_size, **extra)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    return outputs


def split_model(model: nn.Module, num_stages: int,
                split_points: Optional[Sequence[str]] = None) -> PipelineSplit:
    """``model`` split into ``num_stages`` stages (see the module docstring for how).

    Raises:
        ValueError: more stages than blocks, a split point that matches nothing, a hook that
            returns the wrong number of stages, a model cadence cannot split (without a
            ``pipeline_split`` hook), or tied input and output embeddings; each naming the
            setting and the fix.
    """
    hook = getattr(model, "pipeline_split", None)
    if callable(hook):
        result = hook(num_stages, None if split_points is None else list(split_points))
        split = result if isinstance(result, PipelineSplit) else PipelineSplit(list(result))
        if len(split.stages) != num_stages:
            raise ValueError(f"{type(model).__name__}.pipeline_split({num_stages}, ...) returned "
                             f"{len(split.stages)} stages; it must return {num_stages}.")
        return split
    hf = getattr(model, "model", None)
    family = _hf_family(hf) if isinstance(hf, nn.Module) else None
    if family is None:
        raise ValueError(
            f"{_KEY}: cadence cannot split {type(model).__name__} into pipeline stages: it "
            f"splits Hugging Face GPT-2 and model.layers decoders (Llama, Mistral, Qwen) "
            f"inside a HuggingFaceModel. Define pipeline_split(num_stages, split_points) on the "
            f"model, returning its stages.")
    embedding = (hf.transformer.wte if family == "gpt2" else hf.model.embed_tokens).weight
    if hf.lm_head.weight is embedding:
        raise ValueError(
            f"{_KEY}: {type(hf).__name__} ties its input embedding (first stage) to its output "
            f"projection (last stage); pipeline stages cannot share a weight. Build it with "
            f"tie_word_embeddings=False (the gpt2 model's tie_word_embeddings: false).")
    blocks = hf.transformer.h if family == "gpt2" else hf.model.layers
    names = {id(m): n for n, m in model.named_modules()}
    block_names = [names[id(b)] for b in blocks]
    ranges = stage_block_ranges(block_names, num_stages, split_points)
    stages: list[nn.Module] = [
        DecoderStage(model, hf, family, {i: blocks[i] for i in span},
                     first=s == 0, last=s == num_stages - 1)
        for s, span in enumerate(ranges)]
    return PipelineSplit(stages, default_inputs, _causal_lm_outputs(hf))
