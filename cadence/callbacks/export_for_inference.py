"""The :class:`ExportForInferenceCallback`: export the trained model for inference
(TorchScript, or ONNX) when training ends.

Source: MosaicML Composer's ``ExportForInferenceCallback``
(``composer/callbacks/export_for_inference.py``); the export itself is
:func:`cadence.utils.inference.export_with_logger`.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import torch

from cadence.registry import callbacks
from cadence.core import Callback
from cadence.utils.misc import unwrap_model

if TYPE_CHECKING:
    from cadence.core import State

__all__ = ["ExportForInferenceCallback"]

_FORMATS = ("torchscript", "onnx")


@callbacks.register("export_for_inference")
class ExportForInferenceCallback(Callback):
    """At ``FIT_END`` exports the model (unwrapped from DDP) with
    :func:`cadence.utils.inference.export_with_logger`, as Composer does: to
    ``save_object_store`` under the name ``save_path`` when one is given; else, when a
    logger destination stores files (e.g. a
    :class:`~cadence.loggers.RemoteUploaderDownloader`), handed to it as ``save_path``
    (``logger.upload_file``) and not written locally; else written to the local path
    ``save_path``.

    For ONNX (traced) a sample input is needed: without ``sample_input`` the first training
    batch (a copy of ``state.batch`` at the first ``AFTER_DATALOADER``) is used.

    Args:
        save_format: ``'torchscript'`` or ``'onnx'`` (``pip install onnx``), or an
            ``ExportFormat``.
        save_path: the exported file: a local path, or the object's name when
            ``save_object_store`` is given.
        save_object_store: an object store (Composer's ``ObjectStore`` interface, or a
            :class:`~cadence.loggers.RemoteUploaderDownloader`) to upload to. Default none.
        sample_input: example model input for tracing (ONNX); default the first batch.
        transforms: functions ``model -> model`` applied to a copy before export (e.g.
            fusing layers). Default none.
        input_names, output_names: ONNX graph input and output names; default ONNX's.

    Raises:
        ValueError: ``save_format`` is neither format.
    """

    def __init__(self, save_format: Any, save_path: str, save_object_store: Optional[Any] = None,
                 sample_input: Optional[Any] = None,
                 transforms: Optional[Sequence[Callable[[torch.nn.Module], torch.nn.Module]]] = None,
                 input_names: Optional[Sequence[str]] = None,
                 output_names: Optional[Sequence[str]] = None) -> None:
        fmt = str(getattr(save_format, "value", save_format)).lower()
        if fmt not in _FORMATS:
            raise ValueError(f"ExportForInferenceCallback save_format must be one of {_FORMATS}, "
                             f"got {save_format!r}.")
        self.save_format: Union[str, Any] = save_format
        self._format = fmt
        self.save_path = str(save_path)
        self.save_object_store = save_object_store
        self.sample_input = sample_input
        self.transforms = list(transforms) if transforms is not None else None
        self.input_names = None if input_names is None else list(input_names)
        self.output_names = None if output_names is None else list(output_names)

    def fit_start(self, state: State, logger: Any) -> None:
        """A TorchScript export without ``sample_input`` (so nothing to trace with) and
        without ``transforms`` is tried now, so a model TorchScript cannot compile fails
        before training, not after it (unsharded models only; the export at ``FIT_END``
        refuses sharded ones anyway).

        Raises:
            ValueError: naming the model, torch's reason and the fixes.
        """
        del logger
        if self._format != "torchscript" or self.sample_input is not None or self.transforms \
                or state.fsdp_enabled:
            return
        from cadence.utils.inference import scripting_error

        model = unwrap_model(state.model)
        error = scripting_error(model)
        if error is not None:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise ValueError(
                f"ExportForInferenceCallback: {type(model).__name__} cannot be exported as "
                f"TorchScript: torch.jit.script failed ({type(error).__name__}: {reason}). "
                f"Give sample_input= (the model is traced with it instead), or use "
                f"save_format='onnx' (traced with the first batch). Checked at FIT_START, "
                f"before training.")

    def after_dataloader(self, state: State, logger: Any) -> None:
        del logger
        if self.sample_input is None and self._format == "onnx":
            self.sample_input = copy.deepcopy(state.batch)

    def fit_end(self, state: State, logger: Any) -> None:
        self.export_model(state, logger)

    def export_model(self, state: State, logger: Any) -> None:
        """Export ``state.model`` now.

        Raises:
            ValueError: the model is not a ``torch.nn.Module``.
            ImportError: ``cadence.utils.inference`` (or ``onnx`` for ONNX) is missing.
        """
        from cadence.utils.inference import export_with_logger

        model = unwrap_model(state.model)
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"Exporting needs a torch.nn.Module, got {type(model).__name__}.")
        export_with_logger(model=model, save_format=self.save_format, save_path=self.save_path,
                           logger=logger, save_object_store=self.save_object_store,
                           sample_input=(self.sample_input,), transforms=self.transforms,
                           input_names=self.input_names, output_names=self.output_names)
