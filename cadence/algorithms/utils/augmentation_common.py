"""The bridge between ``PIL`` images and tensors that lets the ``PIL`` augmentations of
:mod:`cadence.algorithms.utils.augmentation_primitives` run on tensors and batches too.

Source: MosaicML Composer's ``composer/algorithms/utils/augmentation_common.py`` (same names
and semantics). Differences, on purpose: tensor -> ``PIL`` rounds ``x * 255`` to the nearest
integer (torchvision truncates), so a ``k / 255`` float image survives the round trip
exactly. Pillow is imported on first use (the ``vision`` extra:
``pip install 'cadence[vision]'``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import numpy as np
import torch

if TYPE_CHECKING:
    from PIL.Image import Image as PillowImage

__all__ = ["image_as_type", "map_pillow_function"]

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
