"""Image augmentations on ``PIL.Image`` images, shared by RandAugment and AugMix (on tensors
too, through :mod:`cadence.algorithms.utils.augmentation_common`).

Every augmentation is ``fn(pil_img, level) -> pil_img``; ``level`` is an intensity in
``[0, 10]`` (10 the strongest). The image keeps its size and mode. Operations that draw a
magnitude draw it at random for each call (NumPy's global generator, which
:func:`cadence.utils.reproducibility.seed_all` seeds and the ``DataLoader`` reseeds per
worker), so one level gives a range of strengths, as in the AugMix reference code.

Source: Hendrycks et al., "AugMix: A Simple Data Processing Method to Improve Robustness and
Uncertainty", ICLR 2020 (reference ``augmentations.py``); Cubuk et al., "RandAugment:
Practical automated data augmentation with a reduced search space", NeurIPS 2020; MosaicML
Composer's ``composer/algorithms/utils/augmentation_primitives.py`` (same names, levels and
sets).
Built on Pillow's ``ImageOps`` and ``ImageEnhance``; Pillow is imported on first use (the
``vision`` extra: ``pip install 'cadence[vision]'``).

Differences from Composer, on purpose:

- A level below the bottom of a sampling range (``level < 0.1``, or ``< 1`` for the
  enhancement factors) draws from the empty range at that level instead of from a reversed
  one, so level 0 leaves ``rotate``, ``solarize``, ``shear_*``, ``translate_*``, ``color``,
  ``contrast``, ``brightness`` and ``sharpness`` unchanged (Composer's level 0 still
  changes most of them).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from cadence.algorithms.utils.augmentation_common import _pil

__all__ = [
    "AugmentationFn", "augmentation_sets", "autocontrast", "brightness",
    "brightness_original", "color", "color_original", "contrast", "contrast_original",
    "equalize", "posterize", "rotate", "sharpness", "sharpness_original", "shear_x", "shear_y",
    "solarize", "translate_x", "translate_y",
]

#: An augmentation: ``(image, level in [0, 10]) -> image`` of the same size and mode.
AugmentationFn = Callable[[Any, float], Any]


# ----------------------------------------------------------------------- level sampling
def _int_parameter(level: float, maxval: float) -> int:
    """``level / 10 * maxval``, truncated to an int."""
    return int(level * maxval / 10)


def _float_parameter(level: float, maxval: float) -> float:
    """``level / 10 * maxval``."""
    return float(level) * maxval / 10.0


def _sample_level(level: float) -> float:
    """Uniform in ``[0.1, level]``; ``level`` itself when it is below 0.1."""
    return float(np.random.uniform(0.1, level)) if level > 0.1 else float(level)


def _symmetric_sample(level: float) -> float:
    """An enhancement factor around 1 (1 = unchanged): with probability 1/2 uniform in
    ``[1, level]`` (stronger), else uniform in ``[1 - 0.09 * level, 1]`` (weaker, down to
    0.1 at level 10). Level 0 gives exactly 1."""
    if np.random.uniform() > 0.5:
        return float(np.random.uniform(1.0, max(1.0, level)))
    return float(np.random.uniform(1.0 - 0.09 * level, 1.0))


def _signed(value: float) -> float:
    """``value`` with a random sign."""
    return -value if np.random.uniform() > 0.5 else value


def _affine(pil_img: Any, coefficients: tuple[float, ...]) -> Any:
    PIL = _pil()
    return pil_img.transform(pil_img.size, PIL.Image.Transform.AFFINE, coefficients,
                             resample=PIL.Image.Resampling.BILINEAR)


# ----------------------------------------------------------------------- augmentations
def autocontrast(pil_img: Any, level: float = 0.0) -> Any:
    """Stretch each channel to the full ``[0, 255]`` range (``ImageOps.autocontrast``);
    ``level`` is ignored."""
    del level
    return _pil().ImageOps.autocontrast(pil_img)


def equalize(pil_img: Any, level: float = 0.0) -> Any:
    """Equalize each channel's histogram (``ImageOps.equalize``); ``level`` is ignored."""
    del level
    return _pil().ImageOps.equalize(pil_img)


def posterize(pil_img: Any, level: float) -> Any:
    """Keep ``4 - k`` bits per channel, ``k`` drawn up to ``0.4 * level`` (4 bits at level 0,
    as in the AugMix reference: never the identity)."""
    bits = 4 - _int_parameter(_sample_level(level), 4)
    return _pil().ImageOps.posterize(pil_img, bits)


def rotate(pil_img: Any, level: float) -> Any:
    """Rotate by up to ``3 * level`` degrees (whole degrees, random sign), bilinear, about
    the centre; corners fill with black."""
    degrees = _signed(_int_parameter(_sample_level(level), 30))
    return pil_img.rotate(degrees, resample=_pil().Image.Resampling.BILINEAR)


def solarize(pil_img: Any, level: float) -> Any:
    """Invert the pixels at or above a threshold of ``256 - k``, ``k`` drawn up to
    ``25.6 * level`` (``ImageOps.solarize``)."""
    threshold = 256 - _int_parameter(_sample_level(level), 256)
    return _pil().ImageOps.solarize(pil_img, threshold)


def shear_x(pil_img: Any, level: float) -> Any:
    """Shear horizontally by a factor of up to ``0.03 * level`` (random sign), bilinear."""
    factor = _signed(_float_parameter(_sample_level(level), 0.3))
    return _affine(pil_img, (1, factor, 0, 0, 1, 0))


def shear_y(pil_img: Any, level: float) -> Any:
    """Shear vertically by a factor of up to ``0.03 * level`` (random sign), bilinear."""
    factor = _signed(_float_parameter(_sample_level(level), 0.3))
    return _affine(pil_img, (1, 0, 0, factor, 1, 0))


def translate_x(pil_img: Any, level: float) -> Any:
    """Shift horizontally by up to ``level / 30`` of the width (whole pixels, random sign)."""
    pixels = _signed(_int_parameter(_sample_level(level), pil_img.size[0] / 3))
    return _affine(pil_img, (1, 0, pixels, 0, 1, 0))


def translate_y(pil_img: Any, level: float) -> Any:
    """Shift vertically by up to ``level / 30`` of the height (whole pixels, random sign)."""
    pixels = _signed(_int_parameter(_sample_level(level), pil_img.size[1] / 3))
    return _affine(pil_img, (1, 0, 0, 0, 1, pixels))


def color(pil_img: Any, level: float) -> Any:
    """Scale saturation by a factor around 1 (``ImageEnhance.Color``); see
    :func:`_symmetric_sample` for the factor."""
    return _pil().ImageEnhance.Color(pil_img).enhance(_symmetric_sample(level))


def contrast(pil_img: Any, level: float) -> Any:
    """Scale contrast by a factor around 1 (``ImageEnhance.Contrast``)."""
    return _pil().ImageEnhance.Contrast(pil_img).enhance(_symmetric_sample(level))


def brightness(pil_img: Any, level: float) -> Any:
    """Scale brightness by a factor around 1 (``ImageEnhance.Brightness``); factors above 1
    are multiplied by 0.75 (brightening is milder), as in Composer."""
    factor = _symmetric_sample(level)
    return _pil().ImageEnhance.Brightness(pil_img).enhance(factor * 0.75 if factor > 1 else factor)


def sharpness(pil_img: Any, level: float) -> Any:
    """Scale sharpness by a factor around 1 (``ImageEnhance.Sharpness``)."""
    return _pil().ImageEnhance.Sharpness(pil_img).enhance(_symmetric_sample(level))


def _original_factor(level: float) -> float:
    """The AugMix reference's enhancement factor: ``0.1 + 0.18 * k``, ``k`` drawn in
    ``[0.1, level]`` (so 0.118 to 1.9): below 1 weakens, above strengthens."""
    return _float_parameter(_sample_level(level), 1.8) + 0.1


def color_original(pil_img: Any, level: float) -> Any:
    """:func:`color` with the AugMix reference's factor (:func:`_original_factor`)."""
    return _pil().ImageEnhance.Color(pil_img).enhance(_original_factor(level))


def contrast_original(pil_img: Any, level: float) -> Any:
    """:func:`contrast` with the AugMix reference's factor."""
    return _pil().ImageEnhance.Contrast(pil_img).enhance(_original_factor(level))


def brightness_original(pil_img: Any, level: float) -> Any:
    """:func:`brightness` with the AugMix reference's factor."""
    return _pil().ImageEnhance.Brightness(pil_img).enhance(_original_factor(level))


def sharpness_original(pil_img: Any, level: float) -> Any:
    """:func:`sharpness` with the AugMix reference's factor."""
    return _pil().ImageEnhance.Sharpness(pil_img).enhance(_original_factor(level))


_GEOMETRIC_AND_TONAL = [autocontrast, equalize, posterize, rotate, solarize, shear_x, shear_y,
                        translate_x, translate_y]

#: The augmentation sets RandAugment and AugMix draw from, by name:
#:
#: - ``"all"``: every augmentation, with the enhancement factors centred on 1;
#: - ``"safe"``: leaves out color, contrast, brightness and sharpness, which overlap with
#:   the ImageNet-C / CIFAR-10-C corruptions (for robustness evaluations);
#: - ``"original"``: as ``"all"``, with the AugMix reference's enhancement factors.
augmentation_sets: dict[str, list[AugmentationFn]] = {
    "all": _GEOMETRIC_AND_TONAL + [color, contrast, brightness, sharpness],
    "safe": list(_GEOMETRIC_AND_TONAL),
    "original": _GEOMETRIC_AND_TONAL + [color_original, contrast_original,
                                        brightness_original, sharpness_original],
}


def check_augmentation_set(augmentation_set: str, owner: str) -> list[AugmentationFn]:
    """The augmentations named ``augmentation_set``.

    Raises:
        KeyError: an unknown name (as Composer), naming the allowed ones.
    """
    if augmentation_set not in augmentation_sets:
        raise KeyError(f"{owner}: augmentation_set={augmentation_set!r} is not one of "
                       f"{sorted(augmentation_sets)}.")
    return augmentation_sets[augmentation_set]


def check_severity(severity: Any, owner: str) -> int:
    """``severity`` checked to be an int in ``[0, 10]``.

    Raises:
        ValueError: out of range or not an integer.
    """
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) \
            or not 0 <= severity <= 10:
        raise ValueError(f"{owner}: severity must be an integer in [0, 10], got {severity!r}.")
    return int(severity)
