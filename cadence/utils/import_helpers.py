"""Composer's ``composer.utils.import_helpers``: the error an optional package raises when it
is missing, and importing an object by ``module:name``.

Source: Composer 0.32.1 ``composer/utils/import_helpers.py`` (names, arguments, the
``module:name`` form); the message names cadence's extra.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

__all__ = ["MissingConditionalImportError", "import_object"]


class MissingConditionalImportError(ImportError):
    """An optional package is not installed.

    Args:
        extra_deps_group: the cadence extra that installs it (``pip install
            'cadence[<extra_deps_group>]'``), e.g. ``"s3"``, ``"peft"``.
        conda_package: the package(s) to install (named in the conda / pip command).
        conda_channel: the conda channel; ``None``: the package is installed with pip only.
            Default ``"conda-forge"``.
    """

    def __init__(self, extra_deps_group: str, conda_package: str,
                 conda_channel: Optional[str] = "conda-forge") -> None:
        other = (f"conda install -c {conda_channel} {conda_package}" if conda_channel
                 else f"pip install {conda_package}")
        super().__init__(
            f"cadence was installed without {extra_deps_group} support. To use it, run "
            f"`pip install 'cadence[{extra_deps_group}]'` (or `{other}`).")
        self.extra_deps_group = extra_deps_group
        self.conda_package = conda_package


def import_object(name: str) -> Any:
    """The object ``name`` names, as ``"package.module:attribute"``.

    Raises:
        ValueError: ``name`` has no single ``:`` separating the module from the attribute.
        ModuleNotFoundError: the module does not import.
        AttributeError: the module has no such attribute.
    """
    if name.count(":") != 1:
        raise ValueError(f"import_object needs 'module:attribute' (one ':'), got {name!r}; "
                         f"e.g. 'functools:partial'.")
    module_name, attribute = name.split(":")
    return getattr(importlib.import_module(module_name), attribute)
