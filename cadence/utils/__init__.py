"""Composer's ``composer.utils``: small utilities shared across cadence.

Submodules: :mod:`~cadence.utils.dist` (distributed helpers, also ``cadence.dist``),
:mod:`~cadence.utils.reproducibility`, :mod:`~cadence.utils.misc`,
:mod:`~cadence.utils.batch_helpers`, :mod:`~cadence.utils.device`,
:mod:`~cadence.utils.precision`, :mod:`~cadence.utils.flops`,
:mod:`~cadence.utils.checkpoint` (Composer's ``save_checkpoint`` / ``load_checkpoint``),
:mod:`~cadence.utils.module_surgery` (``replace_module_classes``),
:mod:`~cadence.utils.inference` (``export_for_inference``: TorchScript / ONNX). Names are
imported on first use (:mod:`cadence._lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cadence._lazy import lazy_exports

if TYPE_CHECKING:
    from cadence.utils import checkpoint, dist, inference, module_surgery, reproducibility
    from cadence.loggers.remote_uploader_downloader import (
        maybe_create_remote_uploader_downloader_from_uri,
    )
    from cadence.parallel.config import FSDPConfig, ParallelismConfig, TPConfig
    from cadence.utils import file_helpers, import_helpers, object_store, retrying
    from cadence.utils.batch_helpers import batch_get, batch_set
    from cadence.utils.file_helpers import (
        format_name_with_dist, format_name_with_dist_and_time, get_file,
        maybe_create_object_store_from_uri, parse_uri,
    )
    from cadence.utils.import_helpers import MissingConditionalImportError, import_object
    from cadence.utils.iter_helpers import ensure_tuple
    from cadence.utils.object_store import (
        LibcloudObjectStore, ObjectStore, ObjectStoreTransientError, S3ObjectStore,
        SFTPObjectStore,
    )
    from cadence.utils.retrying import retry
    from cadence.utils.checkpoint import load_checkpoint, safe_torch_load, save_checkpoint
    from cadence.utils.device import get_device
    from cadence.utils.inference import ExportFormat, export_for_inference, export_with_logger
    from cadence.utils.misc import (
        add_vision_dataset_transform, create_interval_scheduler, partial_format,
    )
    from cadence.utils.precision import bf16_supported
    from cadence.utils.reproducibility import seed_all

_LAZY = {
    "FSDPConfig": "cadence.parallel.config",
    "MissingConditionalImportError": "cadence.utils.import_helpers",
    "LibcloudObjectStore": "cadence.utils.object_store",
    "ObjectStore": "cadence.utils.object_store",
    "S3ObjectStore": "cadence.utils.object_store",
    "SFTPObjectStore": "cadence.utils.object_store",
    "ObjectStoreTransientError": "cadence.utils.object_store",
    "ParallelismConfig": "cadence.parallel.config",
    "TPConfig": "cadence.parallel.config",
    "file_helpers": "cadence.utils.file_helpers",
    "format_name_with_dist": "cadence.utils.file_helpers",
    "format_name_with_dist_and_time": "cadence.utils.file_helpers",
    "get_file": "cadence.utils.file_helpers",
    "import_helpers": "cadence.utils.import_helpers",
    "import_object": "cadence.utils.import_helpers",
    "ensure_tuple": "cadence.utils.iter_helpers",
    "iter_helpers": "cadence.utils.iter_helpers",
    "maybe_create_object_store_from_uri": "cadence.utils.file_helpers",
    "maybe_create_remote_uploader_downloader_from_uri":
        "cadence.loggers.remote_uploader_downloader",
    "object_store": "cadence.utils.object_store",
    "parse_uri": "cadence.utils.file_helpers",
    "partial_format": "cadence.utils.misc",
    "retry": "cadence.utils.retrying",
    "retrying": "cadence.utils.retrying",
    "safe_torch_load": "cadence.utils.checkpoint",
    "add_vision_dataset_transform": "cadence.utils.misc",
    "batch_get": "cadence.utils.batch_helpers",
    "batch_set": "cadence.utils.batch_helpers",
    "bf16_supported": "cadence.utils.precision",
    "checkpoint": "cadence.utils.checkpoint",
    "create_interval_scheduler": "cadence.utils.misc",
    "dist": "cadence.utils.dist",
    "export_for_inference": "cadence.utils.inference",
    "export_with_logger": "cadence.utils.inference",
    "ExportFormat": "cadence.utils.inference",
    "get_device": "cadence.utils.device",
    "inference": "cadence.utils.inference",
    "load_checkpoint": "cadence.utils.checkpoint",
    "module_surgery": "cadence.utils.module_surgery",
    "reproducibility": "cadence.utils.reproducibility",
    "save_checkpoint": "cadence.utils.checkpoint",
    "seed_all": "cadence.utils.reproducibility",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
