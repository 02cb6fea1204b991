"""ALiBi's linear attention biases and the per-model policies that
:func:`~cadence.algorithms.apply_alibi` uses (Hugging Face GPT-2, BERT and RoBERTa).

ALiBi (Press et al., "Train Short, Test Long: Attention with Linear Biases Enables Input
Length Extrapolation", ICLR 2022) adds no position embedding; instead, head ``h`` of ``H``
adds ``-m_h * (i - j)`` to the attention logit of query position ``i`` and key position
``j``, with the head slopes ``m_h = 2 ** (-8 h / H)`` for ``h = 1 .. H`` (a geometric
sequence; :func:`get_alibi_head_slopes` for ``H`` not a power of two). Causal (GPT) models
only see ``j <= i``; bidirectional (BERT) models use ``-m_h * |i - j|``, as in Composer's
BERT surgery and the paper's authors' encoder recipe.

How the bias reaches the attention: ``transformers`` (5.x) computes attention in one
dispatched function (``eager`` or ``sdpa``, ``config._attn_implementation``) that adds the
``attention_mask`` it is given to the logits. The converted attention modules
(:class:`GPT2AlibiAttention`, :class:`BertAlibiSelfAttention`,
:class:`RobertaAlibiSelfAttention`) turn that mask (``None``, a
boolean or an additive one) into one additive float mask ``[batch or 1, H, q_len, k_len]``
holding the ALiBi bias where attention is allowed and the dtype's minimum where it is not,
then run the original forward: projections, cache and output stay transformers' own code.
``flash_attention_2`` and ``flex_attention`` take no additive mask and are refused.

The position embedding is replaced by a :class:`ZeroPositionEmbedding` of
``max_sequence_length`` rows: zero, frozen, and ignored by its forward (which returns
zeros), so no position information enters but through the bias.

Source: Press et al. 2022 (above); the reference implementation
https://github.com/ofirpress/attention_with_linear_biases (slopes for any number of heads);
Composer's ``composer/algorithms/alibi/attention_surgery_functions`` (which modules change:
GPT-2, BERT and RoBERTa attention, position embeddings zeroed, frozen and resized).
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from transformers.models.bert.modeling_bert import BertEmbeddings, BertSelfAttention
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention, GPT2Model
from transformers.models.roberta.modeling_roberta import RobertaEmbeddings, RobertaSelfAttention

__all__ = [
    "AlibiPolicy", "BertAlibiSelfAttention", "GPT2AlibiAttention", "RobertaAlibiSelfAttention",
    "SUPPORTED_ATTENTION",
    "ZeroPositionEmbedding", "alibi_attention_mask", "alibi_bias", "get_alibi_head_slopes",
    "resize_positions_buffer",
    "policy_registry",
]

#: attention implementations whose dispatched function adds an additive float mask
SUPPORTED_ATTENTION = ("eager", "sdpa")


def get_alibi_head_slopes(n_heads: int) -> list[float]:
    """The ALiBi slope of each of ``n_heads`` heads, largest first.

    For ``n_heads = 2**k``: ``2 ** (-8 h / n_heads)`` for ``h = 1 .. n_heads`` (Press et al.
    2022, Section 3). Otherwise, as the paper's reference code: the slopes of the largest
    power of two ``p < n_heads``, then every other slope of ``2 p`` heads for the rest.

    Raises:
        ValueError: ``n_heads`` is not a positive integer.
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}.")
    if n_heads & (n_heads - 1) == 0:
        return [2.0 ** (-8.0 * h / n_heads) for h in range(1, n_heads + 1)]
    power = 2 ** math.floor(math.log2(n_heads))
    return get_alibi_head_slopes(power) + get_alibi_head_slopes(2 * power)[0::2][:n_heads - power]


def alibi_bias(n_heads: int, query_length: int, key_length: int, causal: bool,
               device: Any = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """ALiBi's additive attention bias, ``[1, n_heads, query_length, key_length]``.

    Query ``i`` sits at position ``key_length - query_length + i`` (the queries are the last
    tokens, as with a key/value cache), key ``j`` at ``j``; the entry is ``-m_h * (pos_q -
    pos_k)`` (causal) or ``-m_h * |pos_q - pos_k|`` (bidirectional). Causal entries with
    ``pos_k > pos_q`` hold ``torch.finfo(dtype).min`` (not attended).
    """
    slopes = torch.tensor(get_alibi_head_slopes(n_heads), device=device, dtype=torch.float32)
    q_pos = torch.arange(key_length - query_length, key_length, device=device)
    k_pos = torch.arange(key_length, device=device)
    distance = (q_pos[:, None] - k_pos[None, :]).to(torch.float32)  # [q, k]
    bias = -slopes[:, None, None] * (distance if causal else distance.abs())
    if causal:
        bias = bias.masked_fill(distance < 0, torch.finfo(torch.float32).min)
    return bias.unsqueeze(0).to(dtype)


def alibi_attention_mask(attention_mask: torch.Tensor | None, n_heads: int,
                         query_length: int, key_length: int, causal: bool,
                         dtype: torch.dtype, device: Any) -> torch.Tensor:
    """``attention_mask`` (as transformers hands it to an attention module) with ALiBi's bias.

    Args:
        attention_mask: ``None`` (attend everywhere, causally when ``causal``), a boolean
            mask (``True`` = attend) or an additive float mask, broadcastable to
            ``[batch, 1 or n_heads, query_length, key_length]``.
        n_heads, query_length, key_length, causal: as :func:`alibi_bias`.
        dtype: the logits' dtype (the autocast dtype under AMP); SDPA wants the mask in it.
        device: where to build the mask.

    Returns:
        An additive float mask ``[batch or 1, n_heads, query_length, key_length]``: the ALiBi
        bias where attention is allowed, ``torch.finfo(dtype).min`` elsewhere.
    """
    floor = torch.finfo(dtype).min
    bias = alibi_bias(n_heads, query_length, key_length, causal, device=device)
    if attention_mask is None:
        combined = bias
    elif attention_mask.dtype == torch.bool:
        combined = torch.where(attention_mask.to(device), bias, torch.finfo(torch.float32).min)
    else:  # additive: 0 where allowed, a large negative number where not
        combined = bias + attention_mask.to(device=device, dtype=torch.float32)
    return combined.clamp(min=floor).to(dtype)


def _logits_dtype(hidden_states: torch.Tensor) -> torch.dtype:
    """The dtype attention logits will have: the autocast dtype when autocast is on."""
    device_type = hidden_states.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden_states.dtype


def _past_length(cache: Any, layer_idx: int | None) -> int:
    """Tokens already in a transformers ``Cache`` for this layer (0 without one)."""
    if cache is None:
        return 0
    cache = getattr(cache, "self_attention_cache", cache)  # EncoderDecoderCache
    return int(cache.get_seq_length(layer_idx or 0))


class _AlibiMixin:
    """Rewrites the ``attention_mask`` argument of the parent attention's ``forward``."""

    _parent: type[nn.Module]
    _signature: inspect.Signature | None = None
    _causal: bool

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        cls = type(self)
        if cls._signature is None:
            cls._signature = inspect.signature(cls._parent.forward)
        bound = cls._signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        hidden = arguments["hidden_states"]
        mask = arguments.get("attention_mask")
        query_length = hidden.shape[-2]
        key_length = query_length + _past_length(arguments.get("cache"), self.layer_idx)
        if mask is not None and mask.ndim == 4:
            key_length = mask.shape[-1]
        arguments["attention_mask"] = alibi_attention_mask(
            mask, self.alibi_heads, query_length, key_length, self._causal,
            dtype=_logits_dtype(hidden), device=hidden.device)
        return cls._parent.forward(*bound.args, **bound.kwargs)


class GPT2AlibiAttention(_AlibiMixin, GPT2Attention):
    """``GPT2Attention`` with ALiBi's causal bias (no change to its parameters).

    Input ``hidden_states [batch, seq, d_model]``; the bias ``[1, H, seq, past + seq]`` is
    built per call from the number of heads (``alibi_heads``). Built by
    :func:`to_gpt2_alibi_attention` from an existing module.
    """

    _parent = GPT2Attention
    _causal = True
    alibi_heads: int


class BertAlibiSelfAttention(_AlibiMixin, BertSelfAttention):
    """``BertSelfAttention`` with ALiBi's symmetric bias ``-m_h * |i - j|`` (causal
    ``-m_h * (i - j)`` when the module is a decoder's, ``is_causal``)."""

    _parent = BertSelfAttention
    alibi_heads: int

    @property
    def _causal(self) -> bool:  # type: ignore[override]
        return bool(self.is_causal)


class RobertaAlibiSelfAttention(_AlibiMixin, RobertaSelfAttention):
    """``RobertaSelfAttention`` with ALiBi's bias, as :class:`BertAlibiSelfAttention`."""

    _parent = RobertaSelfAttention
    alibi_heads: int

    @property
    def _causal(self) -> bool:  # type: ignore[override]
        return bool(self.is_causal)


def _retyped(module: nn.Module, cls: type[nn.Module], **attributes: Any) -> nn.Module:
    """A new ``cls`` instance holding ``module``'s parameters, buffers and submodules (the
    same tensors), with ``attributes`` set: its state-dict keys are unchanged."""
    new = cls.__new__(cls)
    new.__dict__.update({key: copy.copy(value) if isinstance(value, (dict, set)) else value
                         for key, value in module.__dict__.items()})
    new.__dict__.update(attributes)
    return new


def _check_attention_implementation(module: nn.Module) -> None:
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", "eager")
    if implementation not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"apply_alibi: {type(module).__name__} uses attn_implementation="
            f"{implementation!r}, which takes no additive attention bias; build the model with "
            f"attn_implementation='sdpa' or 'eager' to use ALiBi.")


def to_gpt2_alibi_attention(module: nn.Module, module_index: int) -> nn.Module | None:
    """:data:`~cadence.utils.module_surgery.ReplacementFunction` for ``GPT2Attention``: its
    ALiBi form; cross-attention and already converted modules are left (``None``)."""
    del module_index
    assert isinstance(module, GPT2Attention)
    if isinstance(module, GPT2AlibiAttention) or module.is_cross_attention:
        return None
    _check_attention_implementation(module)
    return _retyped(module, GPT2AlibiAttention, alibi_heads=int(module.num_heads))


def to_bert_alibi_self_attention(module: nn.Module, module_index: int) -> nn.Module | None:
    """:data:`~cadence.utils.module_surgery.ReplacementFunction` for ``BertSelfAttention``
    and ``RobertaSelfAttention`` (the same layout): the matching ALiBi class."""
    del module_index
    alibi_cls = (RobertaAlibiSelfAttention if isinstance(module, RobertaSelfAttention)
                 else BertAlibiSelfAttention)
    assert isinstance(module, alibi_cls._parent)
    if isinstance(module, alibi_cls):
        return None
    _check_attention_implementation(module)
    return _retyped(module, alibi_cls, alibi_heads=int(module.num_attention_heads))


class ZeroPositionEmbedding(nn.Embedding):
    """A position embedding that adds nothing: ``[..., L] -> zeros [..., L, embedding_dim]``.

    Its ``weight [max_sequence_length, embedding_dim]`` is zero and frozen (Composer keeps
    such a weight, so the model's state dict keeps the key); the forward returns zeros
    without reading it, so re-initialising the model (``init_weights()`` after a meta-device
    build) cannot bring positions back.

    Raises (in forward):
        ValueError: a sequence longer than ``max_sequence_length`` (``num_embeddings``).
    """

    def __init__(self, max_sequence_length: int, embedding_dim: int,
                 device: Any = None, dtype: torch.dtype | None = None) -> None:
        super().__init__(max_sequence_length, embedding_dim, device=device, dtype=dtype)
        self.weight.requires_grad_(False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.zero_()

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Embedding's name)
        if input.shape[-1] > self.num_embeddings:
            raise ValueError(
                f"ALiBi: a sequence of {input.shape[-1]} tokens is longer than "
                f"max_sequence_length={self.num_embeddings}; raise Alibi's max_sequence_length.")
        return self.weight.new_zeros(*input.shape, self.embedding_dim)


def resize_positions_buffer(module: nn.Module, name: str, length: int) -> None:
    """Lengthen or shorten a ``[1, positions]`` buffer (BERT's ``position_ids`` = arange,
    ``token_type_ids`` = zeros) to ``length`` positions, keeping it non-persistent."""
    old = getattr(module, name, None)
    if old is None:
        return
    if name == "position_ids":
        new = torch.arange(length, device=old.device, dtype=old.dtype).expand(1, -1)
    else:
        new = torch.zeros(1, length, device=old.device, dtype=old.dtype)
    persistent = name not in module._non_persistent_buffers_set
    module.register_buffer(name, new, persistent=persistent)


@dataclass(frozen=True)
class AlibiPolicy:
    """How to put ALiBi into one model family.

    Attributes:
        attention: the self-attention class to convert.
        convert: a :data:`~cadence.utils.module_surgery.ReplacementFunction` returning the
            ALiBi form of an ``attention`` instance (``None``: leave it).
        embeddings: the class that holds the position embedding.
        position_embedding: the attribute of ``embeddings`` holding it (an ``nn.Embedding``).
        position_buffers: buffers of ``embeddings`` sized by positions, resized too.
        extra_positions: position rows needed beyond ``max_sequence_length`` (RoBERTa's
            position ids start after its ``padding_idx``: ``padding_idx + 1``).
    """

    attention: type[nn.Module]
    convert: Callable[[nn.Module, int], nn.Module | None]
    embeddings: type[nn.Module]
    position_embedding: str
    position_buffers: tuple[str, ...] = ()
    extra_positions: Callable[[nn.Module], int] = lambda embeddings: 0


#: the model families :func:`~cadence.algorithms.apply_alibi` knows; append an
#: :class:`AlibiPolicy` to support another one.
policy_registry: list[AlibiPolicy] = [
    AlibiPolicy(GPT2Attention, to_gpt2_alibi_attention, GPT2Model, "wpe"),
    AlibiPolicy(BertSelfAttention, to_bert_alibi_self_attention, BertEmbeddings,
                "position_embeddings", ("position_ids", "token_type_ids")),
    AlibiPolicy(RobertaSelfAttention, to_bert_alibi_self_attention, RobertaEmbeddings,
                "position_embeddings", ("position_ids", "token_type_ids"),
                lambda embeddings: int(embeddings.padding_idx) + 1),
]
