"""Lazy re-exports for package ``__init__`` files (PEP 562 module ``__getattr__``).

A package that re-exports names from heavy modules (torch, transformers, torchmetrics,
``torch.distributed.checkpoint`` ...) lists them in a ``name -> module`` table instead of
importing them; the module is imported the first time the name is read, so ``import cadence``
and ``cadence --help`` stay light (issue 15). ``from pkg import Name``, ``pkg.Name``,
``dir(pkg)`` and ``__all__`` behave as with eager imports. Values are not cached in the
package: each read asks ``sys.modules`` (a dict look-up once imported), so the package always
agrees with the module that defines the name.

Example (in ``pkg/__init__.py``)::

    __getattr__, __dir__ = lazy_exports(__name__, {"Trainer": "cadence.trainer.trainer"})

This module imports nothing but the standard library.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, names: Mapping[str, str],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` that import ``names`` on first access.

    Args:
        package: the package's ``__name__``.
        names: public name -> dotted module that defines it. A name mapped to the submodule
            of that name (``{"dist": "cadence.dist"}`` in ``cadence``) is the submodule itself.

    Returns:
        ``(__getattr__, __dir__)`` to assign at the package's module level.

    Raises:
        AttributeError: (from ``__getattr__``) a name the package neither defines nor lists,
            in the standard ``module 'pkg' has no attribute 'x'`` form.
    """
    table = dict(names)

    def __getattr__(name: str) -> Any:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(target)  # a dict look-up once it is imported
        return module if target == f"{package}.{name}" else getattr(module, name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
