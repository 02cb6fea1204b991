"""Image augmentations on ``PIL.Image`` images, shared by RandAugment and AugMix, and the
bridge between ``PIL`` images and tensors that lets them run on tensors too.

Every augmentation is ``fn(pil_img, level) -> pil_img``; ``level`` is an intensity in
``[0, 10]`` (10 the strongest). The image keeps its size and mode. Operations that draw a
magnitude draw it at random for each call (NumPy's global generator, which
:func:`cadence.utils.reproducibility.seed_all` seeds and the ``DataLoader`` reseeds per
worker), so one level gives a range of strengths, as in the AugMix reference code.

Source: Hendrycks et al., "AugMix: A Simple Data Processing Method to Improve Robustness and
Uncertainty", ICLR 2020 (reference ``augmentations.py``); Cubuk et al., "RandAugment:
Practical automated data augmentation with a reduced search space", NeurIPS 2020; MosaicML
Composer's ``composer/algorithms/utils/augmentation_primitives.py`` (same names, levels and
sets) and ``augmentation_common.py`` (:func:`image_as_type`, :func:`map_pillow_function`).
Built on Pillow's ``ImageOps`` and ``ImageEnhance``; Pillow is imported on first use (the
``vision`` extra: ``pip install 'cadence[vision]'``).

Differences from Composer, on purpose:

- A level below the bottom of a sampling range (``level < 0.1``, or ``< 1`` for the
  enhancement factors) draws from the empty range at that level instead of from a reversed
  one, so level 0 leaves ``rotate``, ``solarize``, ``shear_*``, ``translate_*``, ``color``,
  ``contrast``, ``brightness`` and ``sharpness`` unchanged (Composer's level 0 still
  changes most of them).
- Tensor -> ``PIL`` rounds ``x * 255`` to the nearest integer (torchvision truncates), so a
  ``k / 255`` float image survives the round trip exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import numpy as np
import torch

if TYPE_CHECKING:
    from PIL.Image import Image as PillowImage

__all__ = [
    "AugmentationFn", "augmentation_sets", "autocontrast", "brightness",
    "brightness_original", "color", "color_original", "contrast", "contrast_original",
    "equalize", "image_as_type", "map_pillow_function", "posterize", "rotate", "sharpness",
    "sharpness_original", "shear_x", "shear_y", "solarize", "translate_x", "translate_y",
]

#: An augmentation: ``(image, level in [0, 10]) -> image`` of the same size and mode.
AugmentationFn = Callable[[Any, float], Any]

ImgT = TypeVar("ImgT", torch.Tensor, "PillowImage")

_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def _pil() -> Any:
    """The ``PIL`` package, or an ImportError that names the extra to install."""
    try:
        import PIL.Image
        import PIL.ImageEnhance
        import PIL.ImageOps
    except ImportError as error:  # pragma: no cover - Pillow is in the test extra
        raise ImportError("The vision augmentations need Pillow: pip install 'cadence[vision]' "
                          "(or pip install Pillow).") from error
    return PIL


def _is_pil(image: Any) -> bool:
    return type(image).__module__.startswith("PIL.") and hasattr(image, "getbands")


# ----------------------------------------------------------------------- PIL <-> tensor
def image_as_type(image: Any, typ: type) -> Any:
    """``image`` as a ``torch.Tensor`` or a ``PIL.Image.Image`` (``typ``).

    ``PIL`` -> tensor: ``[C, H, W]`` float32 in ``[0, 1]`` for 8-bit modes (``L`` gives
    ``C = 1``), the raw values for other modes. Tensor -> ``PIL``: ``[H, W]`` or ``[C, H, W]``
    with ``C`` in 1, 3, 4 (mode ``L``, ``RGB``, ``RGBA``); float values are read as ``[0, 1]``
    (clamped, ``x * 255`` rounded), ``uint8`` as they are. An image already of ``typ`` is
    returned as it is (a batch ``[N, C, H, W]`` asked to stay a tensor included).

    Raises:
        TypeError: ``typ`` is neither, or ``image`` is neither a tensor nor a ``PIL`` image.
        ValueError: a tensor that is not one ``HW`` / ``CHW`` image with 1, 3 or 4 channels.
    """
    PIL = _pil()
    if typ not in (torch.Tensor, PIL.Image.Image):
        raise TypeError(f"image_as_type: typ must be torch.Tensor or PIL.Image.Image, got {typ}.")
    if isinstance(image, typ):
        return image
    if typ is torch.Tensor:
        if not _is_pil(image):
            raise TypeError(f"image_as_type: expected a PIL image or a tensor, got "
                            f"{type(image).__name__}.")
        array = np.asarray(image)
        tensor = torch.from_numpy(array.copy())
        tensor = tensor.unsqueeze(-1) if tensor.ndim == 2 else tensor
        tensor = tensor.permute(2, 0, 1).contiguous()
        return tensor.float().div_(255) if tensor.dtype == torch.uint8 else tensor.float()
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"image_as_type: expected a PIL image or a tensor, got "
                        f"{type(image).__name__}.")
    tensor = image.detach().cpu()
    if tensor.ndim == 2:
        tensor = tensor.unsqueeze(0)
    if tensor.ndim != 3 or tensor.shape[0] not in _PIL_MODES:
        raise ValueError(f"image_as_type: a tensor becomes a PIL image only as [H, W] or "
                         f"[C, H, W] with C in 1, 3, 4; got shape {tuple(image.shape)}.")
    if tensor.dtype != torch.uint8:
        tensor = tensor.float().mul(255).round_().clamp_(0, 255).to(torch.uint8)
    array = tensor.permute(1, 2, 0).numpy()
    channels = array.shape[-1]
    return PIL.Image.fromarray(array[..., 0] if channels == 1 else array)  # L, RGB, RGBA


def map_pillow_function(f_pil: Callable[[Any], Any], imgs: ImgT) -> ImgT:
    """Apply a ``PIL`` function to one image or each image of a batch, keeping the type.

    Args:
        f_pil: ``PIL image -> PIL image``.
        imgs: a ``PIL`` image, a tensor ``[H, W]`` / ``[C, H, W]``, a batch ``[N, C, H, W]``,
            or an iterable of ``PIL`` images.

    Returns:
        The results, as ``imgs`` was given: a ``PIL`` image, a tensor (``[C, H', W']`` float
        in ``[0, 1]`` for one image, stacked for a batch), or a list of ``PIL`` images.
    """
    single = _is_pil(imgs) or (isinstance(imgs, torch.Tensor) and imgs.ndim <= 3)
    if not single and not isinstance(imgs, (torch.Tensor, Iterable)):
        raise TypeError(f"map_pillow_function: expected images, got {type(imgs).__name__}.")
    items = [imgs] if single else list(imgs)
    PIL = _pil()
    outs = [f_pil(image_as_type(item, PIL.Image.Image)) for item in items]
    if isinstance(imgs, torch.Tensor):
        tensors = [image_as_type(out, torch.Tensor) for out in outs]
        if single:
            return tensors[0].squeeze(0) if imgs.ndim == 2 else tensors[0]
        return torch.stack(tensors)
    return outs[0] if single else outs


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
