"""Weight initialisation schemes by name (Composer's ``composer.models.initializers``).

``model.apply(Initializer.KAIMING_NORMAL.get_initializer())`` re-initialises every layer the
scheme applies to and leaves the others; the schemes are torch's ``nn.init`` functions.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Callable

import torch
from torch import nn

__all__ = ["Initializer"]

_WEIGHTED = (nn.Linear, nn.Conv2d)


def _weights(init: Callable[[torch.Tensor], object]) -> Callable[[nn.Module], None]:
    def apply(module: nn.Module) -> None:
        if isinstance(module, _WEIGHTED):
            init(module.weight)
    return apply


def _batchnorm(random_scale: bool) -> Callable[[nn.Module], None]:
    def apply(module: nn.Module) -> None:
        if isinstance(module, nn.BatchNorm2d) and module.affine:
            with torch.no_grad():
                if random_scale:
                    nn.init.uniform_(module.weight)
                else:
                    nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
    return apply


def _linear_log_constant_bias(module: nn.Module) -> None:
    """A Linear layer's bias set to ``-log(out_features)`` (uniform softmax at start)."""
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.constant_(module.bias, -math.log(module.bias.shape[0]))


class Initializer(str, Enum):
    """An initialisation scheme; :meth:`get_initializer` gives the function to pass to
    ``model.apply``.

    - ``kaiming_normal`` / ``kaiming_uniform`` (He et al. 2015), ``xavier_uniform`` /
      ``xavier_normal`` (Glorot & Bengio 2010): the weights of every ``Linear`` and ``Conv2d``.
    - ``bn_ones``: every ``BatchNorm2d`` scale 1 and shift 0; ``bn_uniform``: scale drawn
      from ``U(0, 1)``, shift 0.
    - ``linear_log_constant_bias``: every ``Linear`` bias ``-log(out_features)``.

    ``Initializer("kaiming_normal")`` looks a scheme up by its value (case-sensitive).
    """

    KAIMING_NORMAL = "kaiming_normal"
    KAIMING_UNIFORM = "kaiming_uniform"
    BN_UNIFORM = "bn_uniform"
    BN_ONES = "bn_ones"
    XAVIER_UNIFORM = "xavier_uniform"
    XAVIER_NORMAL = "xavier_normal"
    LINEAR_LOG_CONSTANT_BIAS = "linear_log_constant_bias"

    def get_initializer(self) -> Callable[[nn.Module], None]:
        """The function ``(module) -> None`` that initialises one module in place."""
        schemes: dict[Initializer, Callable[[nn.Module], None]] = {
            Initializer.KAIMING_NORMAL: _weights(nn.init.kaiming_normal_),
            Initializer.KAIMING_UNIFORM: _weights(nn.init.kaiming_uniform_),
            Initializer.XAVIER_UNIFORM: _weights(nn.init.xavier_uniform_),
            Initializer.XAVIER_NORMAL: _weights(nn.init.xavier_normal_),
            Initializer.BN_ONES: _batchnorm(random_scale=False),
            Initializer.BN_UNIFORM: _batchnorm(random_scale=True),
            Initializer.LINEAR_LOG_CONSTANT_BIAS: _linear_log_constant_bias,
        }
        return schemes[self]
