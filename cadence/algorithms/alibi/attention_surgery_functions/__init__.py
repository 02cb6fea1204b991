"""Composer's ``composer.algorithms.alibi.attention_surgery_functions``: ALiBi's attention replacements and their helpers (:mod:`.utils`), read lazily."""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "AlibiPolicy": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "BertAlibiSelfAttention": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "GPT2AlibiAttention": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "RobertaAlibiSelfAttention": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "SUPPORTED_ATTENTION": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "ZeroPositionEmbedding": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "alibi_attention_mask": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "alibi_bias": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "get_alibi_head_slopes": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "policy_registry": "cadence.algorithms.alibi.attention_surgery_functions.utils",
    "resize_positions_buffer": "cadence.algorithms.alibi.attention_surgery_functions.utils",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
