"""Gated Linear Units in BERT's feed-forward blocks.

Source: Shazeer, "GLU Variants Improve Transformer", 2020 (https://arxiv.org/abs/2002.05202),
``FFN_GLU(x) = (act(x W) * x V) W2``; the API of Composer's ``GatedLinearUnits`` /
``apply_gated_linear_units`` / ``BERTGatedFFOutput``
(``composer/algorithms/gated_linear_units/``): same names, arguments and defaults.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Sequence, Union

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.models.bert.modeling_bert import BertIntermediate, BertOutput, BertPreTrainedModel

from cadence.algorithms.warnings import NoEffectWarning
from cadence.registry import algorithms
from cadence.core import Algorithm, Event, State
from cadence.utils import module_surgery
from cadence.algorithms.gated_linear_units.gated_linear_unit_layers import BERTGatedFFOutput

__all__ = ["GatedLinearUnits", "apply_gated_linear_units"]

log = logging.getLogger(__name__)

Optimizers = Union[torch.optim.Optimizer, Sequence[torch.optim.Optimizer]]
ActFn = Union[str, Callable[[torch.Tensor], torch.Tensor]]


class _PassThrough(nn.Identity):
    """What ``BertIntermediate`` becomes: the attention output goes straight to the gated
    block, which holds the up-projections."""


def _resolve_act_fn(act_fn: ActFn | None,
                    model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``act_fn``, a transformers activation name looked up in ``ACT2FN``, or (``None``) the
    one activation every ``BertIntermediate`` of ``model`` uses."""
    if callable(act_fn):
        return act_fn
    if isinstance(act_fn, str):
        if act_fn not in ACT2FN:
            raise ValueError(f"apply_gated_linear_units: act_fn={act_fn!r} is not a transformers "
                             f"activation name; use one of {', '.join(sorted(ACT2FN))}, or a "
                             f"callable.")
        return ACT2FN[act_fn]
    if act_fn is not None:
        raise TypeError(f"apply_gated_linear_units: act_fn must be None, a callable or an "
                        f"activation name, got {type(act_fn).__name__}.")
    found = [m.intermediate_act_fn for m in model.modules() if isinstance(m, BertIntermediate)]
    if len({type(fn) for fn in found}) > 1:
        raise ValueError(
            "apply_gated_linear_units: the model's BertIntermediate modules use different "
            f"activations ({sorted({type(fn).__name__ for fn in found})}); pass act_fn to "
            "choose the one the gated units use.")
    if found[0] is None:
        raise ValueError("apply_gated_linear_units: the model's activation is None; pass act_fn.")
    return found[0]


def apply_gated_linear_units(
    model: nn.Module,
    optimizers: Optimizers | None = None,
    act_fn: ActFn | None = None,
    gated_layer_bias: bool = False,
    non_gated_layer_bias: bool = False,
) -> None:
    """Replace each BERT feed-forward block (``BertIntermediate`` + ``BertOutput``) of
    ``model`` by a gated one (:class:`BERTGatedFFOutput`), in place.

    The new block keeps the widths (``d_embed = hidden_size``, ``d_ff =
    intermediate_size``), dropout and LayerNorm epsilon; its weights are newly initialised
    (PyTorch's ``nn.Linear`` default, as Composer), so apply it before training or
    fine-tuning the block. ``BertIntermediate`` becomes an identity.

    Args:
        model: a ``transformers`` ``BertPreTrainedModel``, or a
            :class:`~cadence.models.HuggingFaceModel` around one; not yet wrapped or sharded.
        optimizers: optimizers already built over ``model.parameters()``: the old feed-forward
            parameters leave them and the new ones join the parameter group they were in.
        act_fn: the gate's activation: a callable, a transformers activation name
            (``"gelu"``, ``"relu"``, ``"silu"``: a cadence addition for run files), or
            ``None`` (default) for the model's own (``config.hidden_act``).
        gated_layer_bias: give the gated projection a bias (default ``False``).
        non_gated_layer_bias: give the non-gated projection a bias (default ``False``).

    Raises:
        TypeError: ``model`` is not a BERT (the message names its type), or is already
            wrapped or sharded; ``act_fn`` of the wrong type.
        ValueError: ``act_fn`` is ``None`` and the model's blocks use different activations,
            or it names no transformers activation.
    """
    inner = getattr(model, "model", model)
    if not isinstance(inner, BertPreTrainedModel):
        raise TypeError(
            f"apply_gated_linear_units: {type(inner).__name__} is not a transformers "
            f"BertPreTrainedModel; gated linear units have a surgery policy for BERT's "
            f"BertIntermediate/BertOutput only.")
    if module_surgery.count_module_instances(model, BertIntermediate) == 0:
        warnings.warn(NoEffectWarning(
            "apply_gated_linear_units: the model has no BertIntermediate left (gated linear "
            "units are probably applied already); nothing changed."), stacklevel=2)
        return
    act = _resolve_act_fn(act_fn, model)

    def to_gated(layer: nn.Module, module_index: int) -> BERTGatedFFOutput:
        del module_index
        assert isinstance(layer, BertOutput)
        return BERTGatedFFOutput(
            d_embed=layer.dense.out_features, d_ff=layer.dense.in_features,
            dropout_rate=layer.dropout.p, act_fn=act, layernorm_eps=layer.LayerNorm.eps,
            gated_layer_bias=gated_layer_bias, non_gated_layer_bias=non_gated_layer_bias,
        ).to(dtype=layer.dense.weight.dtype)

    replaced = module_surgery.replace_module_classes(
        model, {BertIntermediate: lambda layer, index: _PassThrough(), BertOutput: to_gated},
        optimizers)
    log.info("GatedLinearUnits: replaced %d BERT feed-forward modules.", len(replaced))


@algorithms.register("gated_linear_units")
class GatedLinearUnits(Algorithm):
    """Gated linear units in BERT's feed-forward blocks (Shazeer 2020, "GLU Variants Improve
    Transformer"): ``FFN(x) = W_o (act(x W_g) * x W_n)`` instead of ``W_2 act(x W_1)``.

    Runs :func:`apply_gated_linear_units` once at ``INIT`` (module surgery before the Trainer
    parallelizes the model; the optimizers are updated). The new weights are drawn with the
    run's ``rank_zero_seed``, so every rank builds the same model. Shapes: a block maps
    ``[batch, seq, hidden_size] -> [batch, seq, hidden_size]`` through
    ``[batch, seq, intermediate_size]``.

    Args:
        act_fn: the gate's activation (callable or transformers activation name); ``None``
            (default): the model's own.
        gated_layer_bias: bias on the gated projection (default ``False``).
        non_gated_layer_bias: bias on the non-gated projection (default ``False``).

    Raises:
        TypeError, ValueError: at ``INIT``, as :func:`apply_gated_linear_units` (a model that
            is not a BERT is refused naming its type).

    Example (YAML)::

        algorithms:
          gated_linear_units: {act_fn: gelu}
    """

    events = frozenset({Event.INIT})

    def __init__(self, act_fn: ActFn | None = None, gated_layer_bias: bool = False,
                 non_gated_layer_bias: bool = False) -> None:
        if isinstance(act_fn, str) and act_fn not in ACT2FN:
            raise ValueError(f"act_fn={act_fn!r} is not a transformers activation name; use one "
                             f"of {', '.join(sorted(ACT2FN))}, or a callable.")
        self.act_fn = act_fn
        self.gated_layer_bias = bool(gated_layer_bias)
        self.non_gated_layer_bias = bool(non_gated_layer_bias)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(act_fn={self.act_fn!r}, gated_layer_bias="
                f"{self.gated_layer_bias}, non_gated_layer_bias={self.non_gated_layer_bias})")

    def match(self, event: Event, state: State) -> bool:
        return event == Event.INIT

    def apply(self, event: Event, state: State, logger: Any) -> None:
        # The new weights are drawn from the run's seed, not this rank's (the Trainer seeds
        # each rank differently): every rank must build the same model before sharding.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(state.rank_zero_seed)
            apply_gated_linear_units(state.model, state.optimizers, act_fn=self.act_fn,
                                     gated_layer_bias=self.gated_layer_bias,
                                     non_gated_layer_bias=self.non_gated_layer_bias)
