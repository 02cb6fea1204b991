"""Algorithms: each module holds a functional form and a thin :class:`~cadence.Algorithm`.

Composer 0.32.1's 28 algorithms plus cadence's own (``activation_checkpointing``,
``child_tuning``, ``mixed_precision``), one module each under Composer's module name
(``cadence.algorithms.label_smoothing.label_smoothing`` ...). The functional forms are also collected in
:mod:`cadence.functional`. Each module is imported on first use of one of its names; the
registry (YAML ``algorithms:`` keys, each module's snake-case name) imports them all on its
first look-up (:data:`_REGISTERING_MODULES`).
"""

from __future__ import annotations

from cadence._lazy import lazy_exports

#: public name -> the module that defines it
_LAZY = {
    "ActivationCheckpointing": "cadence.algorithms.activation_checkpointing",
    "Alibi": "cadence.algorithms.alibi.alibi",
    "AugmentAndMixTransform": "cadence.algorithms.augmix.augmix",
    "AugMix": "cadence.algorithms.augmix.augmix",
    "BlurPool": "cadence.algorithms.blurpool.blurpool",
    "ChannelsLast": "cadence.algorithms.channels_last.channels_last",
    "ChildTuning": "cadence.algorithms.child_tuning",
    "ClippingType": "cadence.algorithms.gradient_clipping.gradient_clipping",
    "ColOut": "cadence.algorithms.colout.colout",
    "ColOutTransform": "cadence.algorithms.colout.colout",
    "CutMix": "cadence.algorithms.cutmix.cutmix",
    "CutOut": "cadence.algorithms.cutout.cutout",
    "EMA": "cadence.algorithms.ema.ema",
    "Factorize": "cadence.algorithms.factorize.factorize",
    "GatedLinearUnits": "cadence.algorithms.gated_linear_units.gated_linear_units",
    "GhostBatchNorm": "cadence.algorithms.ghost_batchnorm.ghost_batchnorm",
    "GradientClipping": "cadence.algorithms.gradient_clipping.gradient_clipping",
    "GyroDropout": "cadence.algorithms.gyro_dropout.gyro_dropout",
    "LabelSmoothing": "cadence.algorithms.label_smoothing.label_smoothing",
    "LayerFreezing": "cadence.algorithms.layer_freezing.layer_freezing",
    "LowPrecisionGroupNorm": "cadence.algorithms.low_precision_groupnorm.low_precision_groupnorm",
    "LowPrecisionLayerNorm": "cadence.algorithms.low_precision_layernorm.low_precision_layernorm",
    "MixedPrecision": "cadence.algorithms.mixed_precision",
    "MixUp": "cadence.algorithms.mixup.mixup",
    "NoOpModel": "cadence.algorithms.no_op_model.no_op_model",
    "ProgressiveResizing": "cadence.algorithms.progressive_resizing.progressive_resizing",
    "RandAugment": "cadence.algorithms.randaugment.randaugment",
    "RandAugmentTransform": "cadence.algorithms.randaugment.randaugment",
    "SAM": "cadence.algorithms.sam.sam",
    "SAMOptimizer": "cadence.algorithms.sam.sam",
    "SelectiveBackprop": "cadence.algorithms.selective_backprop.selective_backprop",
    "SeqLengthWarmup": "cadence.algorithms.seq_length_warmup.seq_length_warmup",
    "SqueezeExcite": "cadence.algorithms.squeeze_excite.squeeze_excite",
    "SqueezeExcite2d": "cadence.algorithms.squeeze_excite.squeeze_excite",
    "SqueezeExciteConv2d": "cadence.algorithms.squeeze_excite.squeeze_excite",
    "StochasticDepth": "cadence.algorithms.stochastic_depth.stochastic_depth",
    "SWA": "cadence.algorithms.swa.swa",
    "WeightStandardization": "cadence.algorithms.weight_standardization.weight_standardization",
    "apply_activation_checkpointing": "cadence.algorithms.activation_checkpointing",
    "apply_alibi": "cadence.algorithms.alibi.alibi",
    "apply_blurpool": "cadence.algorithms.blurpool.blurpool",
    "apply_channels_last": "cadence.algorithms.channels_last.channels_last",
    "apply_factorization": "cadence.algorithms.factorize.factorize",
    "apply_gated_linear_units": "cadence.algorithms.gated_linear_units.gated_linear_units",
    "apply_ghost_batchnorm": "cadence.algorithms.ghost_batchnorm.ghost_batchnorm",
    "apply_gradient_clipping": "cadence.algorithms.gradient_clipping.gradient_clipping",
    "apply_gyro_dropout": "cadence.algorithms.gyro_dropout.gyro_dropout",
    "apply_low_precision_groupnorm": "cadence.algorithms.low_precision_groupnorm.low_precision_groupnorm",
    "apply_low_precision_layernorm": "cadence.algorithms.low_precision_layernorm.low_precision_layernorm",
    "apply_squeeze_excite": "cadence.algorithms.squeeze_excite.squeeze_excite",
    "apply_stochastic_depth": "cadence.algorithms.stochastic_depth.stochastic_depth",
    "apply_weight_standardization": "cadence.algorithms.weight_standardization.weight_standardization",
    "augmix_image": "cadence.algorithms.augmix.augmix",
    "child_tuning_d_mask_": "cadence.algorithms.child_tuning",
    "child_tuning_f_mask_": "cadence.algorithms.child_tuning",
    "colout_batch": "cadence.algorithms.colout.colout",
    "compute_ema": "cadence.algorithms.ema.ema",
    "cutmix_batch": "cadence.algorithms.cutmix.cutmix",
    "cutout_batch": "cadence.algorithms.cutout.cutout",
    "fisher_information": "cadence.algorithms.child_tuning",
    "fisher_mask": "cadence.algorithms.child_tuning",
    "freeze_layers": "cadence.algorithms.layer_freezing.layer_freezing",
    "mixup_batch": "cadence.algorithms.mixup.mixup",
    "randaugment_image": "cadence.algorithms.randaugment.randaugment",
    "remove_activation_checkpointing": "cadence.algorithms.activation_checkpointing",
    "resize_batch": "cadence.algorithms.progressive_resizing.progressive_resizing",
    "select_using_loss": "cadence.algorithms.selective_backprop.selective_backprop",
    "set_batch_sequence_length": "cadence.algorithms.seq_length_warmup.seq_length_warmup",
    "should_selective_backprop": "cadence.algorithms.selective_backprop.selective_backprop",
    "smooth_labels": "cadence.algorithms.label_smoothing.label_smoothing",
    "smoothing_from_half_life": "cadence.algorithms.ema.ema",
    "top_fraction_threshold": "cadence.algorithms.child_tuning",
}

__all__ = sorted(_LAZY)

#: The modules whose import registers the algorithms in
#: :data:`cadence.registry.registry.algorithms` (the registry imports them on first look-up).
_REGISTERING_MODULES = tuple(sorted(set(_LAZY.values())))

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
