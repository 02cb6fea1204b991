"""Export a model for inference: TorchScript, or ONNX (with the ``onnx`` extra).

Composer's ``composer.utils.inference``: :func:`export_for_inference` (a copy of the model,
on the CPU, in eval mode, optionally modified by ``surgery_algs``, given a checkpoint's
weights and passed through ``transforms``, then written by ``torch.jit.script`` (falling
back to ``torch.jit.trace`` with ``sample_input``) or ``torch.onnx.export``),
:class:`ExportFormat` and :func:`export_with_logger` (through the run's logger when one of
its destinations uploads files). The model given is never modified.

Source: MosaicML Composer 0.32.1 ``composer/utils/inference.py`` (same names, arguments and
defaults); PyTorch ``torch.jit.script`` / ``torch.jit.trace`` / ``torch.jit.save`` and
``torch.onnx.export`` (which needs the ``onnx`` and ``onnxscript`` packages).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import tempfile
import warnings
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union

import torch
from torch import nn

from cadence.utils import dist
from cadence.utils.misc import unwrap_model

if TYPE_CHECKING:
    from cadence.loggers.logger import Logger

__all__ = ["ExportFormat", "Transform", "export_for_inference", "export_with_logger",
           "scripting_error"]

log = logging.getLogger(__name__)

#: a function from a model to a (modified) model, applied before export
Transform = Callable[[nn.Module], nn.Module]


class ExportFormat(str, Enum):
    """``torchscript`` (``torch.jit.save`` of a scripted or traced model) or ``onnx``."""

    TORCHSCRIPT = "torchscript"
    ONNX = "onnx"


def _as_tuple(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _to_cpu(value: Any) -> Any:
    """Tensors in nested tuples / lists / dicts moved to the CPU (new containers)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _check_exportable(model: nn.Module) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if unwrap_model(model) is not model:
        raise ValueError("export_for_inference: pass the module inside DistributedDataParallel "
                         "(model.module), not the wrapper.")
    if isinstance(model, FSDPModule) or any(isinstance(p, DTensor) for p in model.parameters()):
        raise ValueError("export_for_inference: the model is sharded (FSDP2); export a model "
                         "built without sharding, with the checkpoint's weights (load_path=).")


def _copy(model: nn.Module) -> nn.Module:
    """A deep copy on the CPU, without the run's logger (a ComposerModel's ``logger``
    attribute holds the Trainer's State, which is not the model's to copy)."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        logger = module.__dict__.get("logger")
        if logger is not None:
            memo[id(logger)] = None
    return copy.deepcopy(model, memo).cpu()


def _load_weights(model: nn.Module, local: Path, strict: bool) -> None:
    from cadence.checkpoint.export import load_full_state

    saved = load_full_state(local)
    saved = saved.get("state", saved)  # Composer's layout nests the run's state
    missing, unexpected = model.load_state_dict(saved["model"], strict=strict)
    if missing:
        log.warning("export_for_inference: keys missing from the checkpoint: %s",
                    ", ".join(missing))
    if unexpected:
        log.warning("export_for_inference: unexpected keys in the checkpoint: %s",
                    ", ".join(unexpected))


@contextlib.contextmanager
def _local_checkpoint(load_path: Optional[str], store: Any) -> Iterator[Optional[Path]]:
    """A local copy of ``load_path`` (every rank takes part in a download), or None."""
    if load_path is None:
        yield None
        return
    from cadence.checkpoint.object_store import check_object_store, fetched_from_store
    from cadence.checkpoint.remote import fetched

    check_object_store(store)
    with (fetched(load_path) if store is None else fetched_from_store(store, load_path)) as local:
        yield local


@contextlib.contextmanager
def _jit_without_deprecation() -> Iterator[None]:
    """TorchScript is deprecated in recent torch (a DeprecationWarning on each call), and
    still the format Composer's ``'torchscript'`` export writes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        yield


def scripting_error(model: nn.Module) -> Optional[Exception]:
    """Why ``torch.jit.script`` cannot compile ``model`` (the error it raised), or None.
    The scripted module shares ``model``'s tensors: nothing is copied."""
    with _jit_without_deprecation():
        try:
            torch.jit.script(model)
        except Exception as exc:  # torch raises many kinds for unscriptable code
            return exc
    return None


def _torchscript(model: nn.Module, sample_input: Optional[tuple[Any, ...]], path: str) -> None:
    with _jit_without_deprecation():
        try:
            exported = torch.jit.script(model)
        except Exception as exc:  # torch raises many kinds for unscriptable code
            if sample_input is None:
                raise RuntimeError(f"torch.jit.script failed ({type(exc).__name__}: {exc}) "
                                   f"and there is no sample_input to trace the model with "
                                   f"instead; pass sample_input=.") from exc
            log.warning("torch.jit.script failed (%s); tracing with sample_input instead.", exc)
            exported = torch.jit.trace(model, sample_input)
        torch.jit.save(exported, path)


def _onnx(model: nn.Module, sample_input: Optional[tuple[Any, ...]], path: str,
          dynamic_axes: Any, opset: Optional[int], input_names: Optional[Sequence[str]],
          output_names: Optional[Sequence[str]]) -> None:
    if sample_input is None:
        raise ValueError("export_for_inference(save_format='onnx') needs sample_input: an "
                         "input the model accepts as is.")
    try:
        import onnx  # noqa: F401  (torch.onnx.export needs it)
    except ImportError:
        raise ImportError("ONNX export needs the onnx package: pip install 'cadence[onnx]'.") \
            from None
    if input_names is None:
        input_names = [k for item in sample_input if isinstance(item, dict) for k in item]
        input_names = input_names or ["input"]
    # the TorchScript-based exporter: the one whose arguments these are (dynamic_axes,
    # input_names); torch's newer torch.export-based one fails to convert dynamic_axes
    with warnings.catch_warnings():  # it is deprecated, and warns so from many places
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(model, sample_input, path, input_names=list(input_names),
                          output_names=list(output_names or ["output"]),
                          dynamic_axes=dynamic_axes, opset_version=opset, dynamo=False)


def _upload(local: str, save_path: str, store: Any) -> None:
    if store is not None:
        if not callable(getattr(store, "upload_object", None)):
            raise TypeError(f"save_object_store must have upload_object(object_name, "
                            f"filename) (Composer's ObjectStore); got {type(store).__name__}.")
        store.upload_object(object_name=save_path, filename=local)
        return
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"Saving to {save_path!r} needs fsspec and the filesystem's package "
                          f"(pip install 'cadence[s3]' or 'cadence[gcs]').") from None
    fs, remote = fsspec.core.url_to_fs(save_path)
    fs.put_file(local, remote)


def export_for_inference(
    model: nn.Module,
    save_format: Union[str, ExportFormat],
    save_path: str,
    save_object_store: Optional[Any] = None,
    sample_input: Optional[Any] = None,
    dynamic_axes: Optional[Any] = None,
    surgery_algs: Optional[Union[Callable[[nn.Module], Any],
                                 Sequence[Callable[[nn.Module], Any]]]] = None,
    transforms: Optional[Sequence[Transform]] = None,
    onnx_opset_version: Optional[int] = None,
    load_path: Optional[str] = None,
    load_object_store: Optional[Any] = None,
    load_strict: bool = False,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
) -> None:
    """Write ``model`` for inference in ``save_format`` to ``save_path``. Call on every rank
    (a remote ``load_path`` is fetched collectively); rank 0 writes.

    The export is of a deep copy of ``model``, on the CPU, in eval mode: ``surgery_algs``
    (each ``alg(model)``, e.g. ``cadence.functional.apply_squeeze_excite``; a returned module
    replaces the model) run first, so a checkpoint of a modified model fits; then the
    weights of ``load_path`` (the checkpoint's ``model``); then ``transforms`` (each returns
    the model to export, e.g. ``torch.ao.quantization.quantize_dynamic``).

    Args:
        model: the module to export (not a DDP wrapper or an FSDP2-sharded model).
        save_format: ``'torchscript'`` or ``'onnx'`` (:class:`ExportFormat`).
        save_path: a local file path; an fsspec URL (``s3://...``, with its extra); or, with
            ``save_object_store``, the object's name.
        save_object_store: an object with Composer's ``upload_object(object_name,
            filename)``; the export is written locally, then uploaded.
        sample_input: an input the model takes as is (a tuple is the positional
            arguments; anything else one argument, e.g. a ``ComposerClassifier``'s batch
            ``((x, y),)``); needed for ONNX and for tracing when scripting fails. Its
            batch size need not be the one used at inference (see ``dynamic_axes``).
        dynamic_axes: ONNX only: ``{input or output name: {axis: name}}`` of axes whose size
            may change (``{'input': {0: 'batch'}}``).
        surgery_algs: callables applied to the model before the checkpoint loads.
        transforms: callables ``model -> model`` applied last.
        onnx_opset_version: the ONNX opset; None: torch's default.
        load_path: a checkpoint (``full`` file or ``sharded`` folder, local or URL, or an
            object name in ``load_object_store``) whose model weights are exported.
        load_object_store: where ``load_path`` is: an fsspec URL, or an object with
            ``download_object`` / ``download_file``.
        load_strict: the checkpoint's model keys must match exactly (else missing and
            unexpected keys are logged as warnings).
        input_names / output_names: ONNX graph names; default the keys of dicts in
            ``sample_input``, else ``['input']``, and ``['output']``.

    Raises:
        ValueError: an unknown ``save_format``; a DDP or sharded model; ONNX without
            ``sample_input``.
        ImportError: ONNX without the ``onnx`` package, or a URL without fsspec.
        RuntimeError: ``torch.jit.script`` failed and there is no ``sample_input``.
        CheckpointError: ``load_path`` cannot be read.
    """
    try:
        save_format = ExportFormat(str(getattr(save_format, "value", save_format)).lower())
    except ValueError:
        raise ValueError(f"save_format={save_format!r} is not one of: torchscript, "
                         f"onnx.") from None
    _check_exportable(model)
    with _local_checkpoint(load_path, load_object_store) as checkpoint:
        if dist.get_global_rank() != 0:
            return
        model = _copy(model)
        inputs = None if sample_input is None else _to_cpu(_as_tuple(copy.deepcopy(sample_input)))
        for alg in _as_tuple(surgery_algs):
            changed = alg(model)  # in place (None) or the new model
            model = model if changed is None else changed
        if checkpoint is not None:
            _load_weights(model, checkpoint, load_strict)
    model.eval()
    for transform in _as_tuple(transforms):
        model = transform(model)
    remote = save_object_store is not None or "://" in save_path
    with (tempfile.TemporaryDirectory() if remote else contextlib.nullcontext(None)) as tmp:
        local = os.path.join(tmp, "model.export") if tmp else save_path
        if save_format == ExportFormat.TORCHSCRIPT:
            _torchscript(model, inputs, local)
        else:
            _onnx(model, inputs, local, dynamic_axes, onnx_opset_version, input_names,
                  output_names)
        if remote:
            _upload(local, save_path, save_object_store)
    log.info("Exported the model (%s) to %s", save_format.value, save_path)


def export_with_logger(
    model: nn.Module,
    save_format: Union[str, ExportFormat],
    save_path: str,
    logger: Logger,
    save_object_store: Optional[Any] = None,
    sample_input: Optional[Any] = None,
    transforms: Optional[Sequence[Transform]] = None,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
) -> None:
    """:func:`export_for_inference`, uploaded through ``logger`` when no
    ``save_object_store`` is given and one of the logger's destinations uploads files
    (``logger.upload_file(save_path, local file)``); otherwise as
    :func:`export_for_inference` writes it. Arguments as there."""
    if save_object_store is None and logger.has_file_upload_destination():
        with tempfile.TemporaryDirectory() as tmp:
            local = os.path.join(tmp, "model")
            export_for_inference(model, save_format, local, sample_input=sample_input,
                                 transforms=transforms, input_names=input_names,
                                 output_names=output_names)
            if dist.get_global_rank() == 0:
                logger.upload_file(remote_file_name=save_path, file_path=local)
        return
    export_for_inference(model, save_format, save_path, save_object_store=save_object_store,
                         sample_input=sample_input, transforms=transforms,
                         input_names=input_names, output_names=output_names)
