"""Functional forms of the algorithms, for a hand-written training loop (Composer's
``composer.functional``)::

    import cadence.functional as cf

    cf.apply_blurpool(model)                   # module surgery, before building the optimizer
    inputs, targets = cf.smooth_labels(...)    # batch and loss transforms, inside the loop

Each name is defined in its algorithm's module (:mod:`cadence.algorithms`) and imported on
first use.
"""

from __future__ import annotations

from cadence._lazy import lazy_exports

_LAZY = {
    "apply_alibi": "cadence.algorithms.alibi.alibi",
    "augmix_image": "cadence.algorithms.augmix.augmix",
    "apply_blurpool": "cadence.algorithms.blurpool.blurpool",
    "apply_channels_last": "cadence.algorithms.channels_last.channels_last",
    "colout_batch": "cadence.algorithms.colout.colout",
    "compute_ema": "cadence.algorithms.ema.ema",
    "cutmix_batch": "cadence.algorithms.cutmix.cutmix",
    "cutout_batch": "cadence.algorithms.cutout.cutout",
    "apply_factorization": "cadence.algorithms.factorize.factorize",
    "apply_gated_linear_units": "cadence.algorithms.gated_linear_units.gated_linear_units",
    "apply_ghost_batchnorm": "cadence.algorithms.ghost_batchnorm.ghost_batchnorm",
    "apply_gradient_clipping": "cadence.algorithms.gradient_clipping.gradient_clipping",
    "apply_low_precision_layernorm": "cadence.algorithms.low_precision_layernorm.low_precision_layernorm",
    "smooth_labels": "cadence.algorithms.label_smoothing.label_smoothing",
    "freeze_layers": "cadence.algorithms.layer_freezing.layer_freezing",
    "mixup_batch": "cadence.algorithms.mixup.mixup",
    "resize_batch": "cadence.algorithms.progressive_resizing.progressive_resizing",
    "randaugment_image": "cadence.algorithms.randaugment.randaugment",
    "should_selective_backprop": "cadence.algorithms.selective_backprop.selective_backprop",
    "select_using_loss": "cadence.algorithms.selective_backprop.selective_backprop",
    "set_batch_sequence_length": "cadence.algorithms.seq_length_warmup.seq_length_warmup",
    "apply_squeeze_excite": "cadence.algorithms.squeeze_excite.squeeze_excite",
    "apply_stochastic_depth": "cadence.algorithms.stochastic_depth.stochastic_depth",
    "apply_weight_standardization": "cadence.algorithms.weight_standardization.weight_standardization",
    "apply_gyro_dropout": "cadence.algorithms.gyro_dropout.gyro_dropout",
    "apply_low_precision_groupnorm": "cadence.algorithms.low_precision_groupnorm.low_precision_groupnorm",
}

__all__ = list(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
