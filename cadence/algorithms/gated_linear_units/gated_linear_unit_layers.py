"""``BERTGatedFFOutput``: BERT's feed-forward block with a gated linear unit (Composer's
``composer/algorithms/gated_linear_units/gated_linear_unit_layers.py``; Shazeer 2020)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

__all__ = ['BERTGatedFFOutput']


class BERTGatedFFOutput(nn.Module):
    """A post-LayerNorm feed-forward block with a gated linear unit (Shazeer 2020).

    ``out = LayerNorm(dropout(W_o (act(x W_g) * (x W_n))) + residual)`` with
    ``W_g, W_n: [d_embed, d_ff]`` (``gated_layer``, ``non_gated_layer``) and
    ``W_o: [d_ff, d_embed]`` (``wo``, with a bias). It holds ``d_embed * d_ff`` more weights
    than the ``BertIntermediate`` + ``BertOutput`` pair it replaces (three matrices, not two).

    Args:
        d_embed: the model width (input and output features).
        d_ff: the hidden width of the feed-forward block.
        dropout_rate: dropout on ``W_o``'s output, before the residual add.
        act_fn: the activation on the gate, a callable ``Tensor -> Tensor``.
        layernorm_eps: the LayerNorm epsilon.
        gated_layer_bias: whether ``W_g`` has a bias (default ``False``).
        non_gated_layer_bias: whether ``W_n`` has a bias (default ``False``).

    Shapes: ``forward(hidden_states [..., d_embed], residual_connection [..., d_embed]) ->
    [..., d_embed]``.
    """

    def __init__(self, d_embed: int, d_ff: int, dropout_rate: float,
                 act_fn: Callable[[torch.Tensor], torch.Tensor], layernorm_eps: float,
                 gated_layer_bias: bool = False, non_gated_layer_bias: bool = False) -> None:
        super().__init__()
        self.gated_layer = nn.Linear(d_embed, d_ff, bias=gated_layer_bias)
        self.non_gated_layer = nn.Linear(d_embed, d_ff, bias=non_gated_layer_bias)
        self.wo = nn.Linear(d_ff, d_embed)
        self.dropout = nn.Dropout(dropout_rate)
        self.act = act_fn
        self.layernorm = nn.LayerNorm(d_embed, eps=layernorm_eps)

    def forward(self, hidden_states: torch.Tensor,
                residual_connection: torch.Tensor) -> torch.Tensor:
        gated = self.act(self.gated_layer(hidden_states)) * self.non_gated_layer(hidden_states)
        return self.layernorm(self.dropout(self.wo(gated)) + residual_connection)
