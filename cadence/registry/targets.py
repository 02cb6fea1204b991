"""What a dotted import path in a run file may resolve to (issue 25, item 4).

A component section names a registered entry or, for the user's own code, a dotted import
path (``name: my_pkg.models.build_model``). Importing that path runs the user's module, as a
script's ``import`` would; but the path must not reach a callable that was never meant to
build a component: ``callbacks: {os.system: {command: ...}}`` used to run a shell command
while the config was being checked. So a dotted path resolves only to what its key can hold:

* ``callbacks``, ``loggers``, ``algorithms``: a subclass of
  :class:`~cadence.core.callback.Callback`,
  :class:`~cadence.loggers.logger_destination.LoggerDestination`,
  :class:`~cadence.core.algorithm.Algorithm`;
* the builders (``model``, ``train_loader`` / ``eval_loader``, ``optimizer``,
  ``scheduler``): a class of the expected base (``torch.nn.Module``,
  ``torch.utils.data.DataLoader``, ``torch.optim.Optimizer``, a
  :class:`~cadence.optim.scheduler.ComposerScheduler` or torch ``LRScheduler``), or a
  function defined outside the Python standard library and builtins.

The origin is checked before anything is called: a path into a standard-library module
(:data:`sys.stdlib_module_names`, or a module file under sysconfig's ``stdlib`` path and
outside ``site-packages``) is refused without importing it, and an imported target's own
``__module__`` is checked too (``my_pkg.system = os.system`` is still ``posix.system``).

Standard library only: the first, torch-free check stage calls :func:`dotted_path_problem`;
the base classes are looked up in :data:`sys.modules` only (a class cannot derive from a
base whose module was never imported).
"""

from __future__ import annotations

import inspect
import os
import sys
import sysconfig
from typing import Any, Optional

__all__ = [
    "KIND_BASES", "BUILDER_KINDS", "is_dotted_path", "split_dotted_path", "is_stdlib_module",
    "dotted_path_problem", "target_problem",
]

#: Per registry kind, the base classes (defining module, class name) a dotted path may name.
KIND_BASES: dict[str, tuple[tuple[str, str], ...]] = {
    "callback": (("cadence.core.callback", "Callback"),),
    "logger": (("cadence.loggers.logger_destination", "LoggerDestination"),),
    "algorithm": (("cadence.core.algorithm", "Algorithm"),),
    "model": (("torch.nn.modules.module", "Module"),),
    "dataset": (("torch.utils.data.dataloader", "DataLoader"),),
    "optimizer": (("torch.optim.optimizer", "Optimizer"),),
    "scheduler": (("cadence.optim.scheduler", "ComposerScheduler"),
                  ("torch.optim.lr_scheduler", "LRScheduler")),
}

#: Kinds built by calling a builder: a plain function (outside the standard library) is
#: allowed as well as a class of the expected base.
BUILDER_KINDS = ("model", "dataset", "optimizer", "scheduler")

_SHOWN_BASE = {
    "Module": "torch.nn.Module", "DataLoader": "torch.utils.data.DataLoader",
    "Optimizer": "torch.optim.Optimizer", "LRScheduler": "torch.optim.lr_scheduler.LRScheduler",
    "Callback": "cadence.Callback", "LoggerDestination": "cadence.loggers.LoggerDestination",
    "Algorithm": "cadence.Algorithm",
    "ComposerScheduler": "cadence.optim.ComposerScheduler",
}


def is_dotted_path(name: str) -> bool:
    """Whether a component ``name`` is a dotted import path (``pkg.mod.Name``,
    ``pkg.mod:Name``) rather than a registered name."""
    return "." in name or ":" in name


def split_dotted_path(path: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``pkg.mod.Name`` or ``pkg.mod:Name``."""
    if ":" in path:
        module, _, attr = path.partition(":")
    else:
        module, _, attr = path.rpartition(".")
    return module, attr


def _norm(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _inside(path: str, folder: Optional[str]) -> bool:
    if not folder:
        return False
    folder = _norm(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def is_stdlib_module(module_name: str) -> bool:
    """Whether ``module_name`` belongs to the Python standard library or the builtins.

    Its top-level package is in :data:`sys.stdlib_module_names` or
    :data:`sys.builtin_module_names`, or (when already imported) its file lies under
    sysconfig's ``stdlib`` / ``platstdlib`` path and outside ``site-packages``. ``__main__``
    (the user's script) is not.
    """
    top = module_name.partition(".")[0]
    if top == "__main__":
        return False
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return True
    module = sys.modules.get(module_name) or sys.modules.get(top)
    file = getattr(module, "__file__", None)
    if not file:
        return False
    file = _norm(file)
    paths = sysconfig.get_paths()
    if any(_inside(file, paths.get(key)) for key in ("purelib", "platlib")):
        return False
    if "site-packages" in file.split(os.sep) or "dist-packages" in file.split(os.sep):
        return False
    return any(_inside(file, paths.get(key)) for key in ("stdlib", "platstdlib"))


def _bases(kind: str) -> list[type]:
    """The base classes of ``kind`` that exist in this process (imported modules only)."""
    found = []
    for module_name, attr in KIND_BASES.get(kind, ()):
        base = getattr(sys.modules.get(module_name), attr, None)
        if isinstance(base, type):
            found.append(base)
    return found


def _expected(kind: str) -> str:
    names = " or ".join(_SHOWN_BASE.get(attr, attr) for _, attr in KIND_BASES.get(kind, ()))
    if kind in BUILDER_KINDS:
        return (f"a class deriving from {names}, or a function of your own code (outside the "
                f"Python standard library and builtins) that builds the {kind}")
    return f"a class deriving from {names}"


def _origin(target: Any) -> Optional[str]:
    """The module a function or method was defined in (``None`` when it does not say)."""
    if inspect.ismethod(target):
        owner = target.__self__
        owner_module = getattr(owner if inspect.isclass(owner) else type(owner), "__module__", None)
        func_module = getattr(target.__func__, "__module__", None)
        if not isinstance(owner_module, str) or not isinstance(func_module, str):
            return None
        return owner_module if is_stdlib_module(owner_module) else func_module
    module = getattr(target, "__module__", None)
    return module if isinstance(module, str) else None


def target_problem(kind: str, path: str, target: Any) -> Optional[str]:
    """What is wrong with ``target``, found at dotted path ``path``, as a ``kind``
    (``"callback"``, ``"model"``, ...), or ``None`` when the key can hold it. Calls nothing.
    """
    if kind not in KIND_BASES:
        return None
    expected = _expected(kind)
    if inspect.isclass(target):
        bases = _bases(kind)
        if any(base in target.__mro__ for base in bases):
            return None
        return (f"{path!r} is the class {target.__module__}.{target.__qualname__}, which does "
                f"not derive from what a {kind} must be; a dotted path here must name "
                f"{expected}.")
    if kind in BUILDER_KINDS and (inspect.isfunction(target) or inspect.isbuiltin(target)
                                  or inspect.ismethod(target)):
        origin = _origin(target)
        if origin is not None and not is_stdlib_module(origin):
            return None
        where = ("the Python standard library or builtins" if origin is not None
                 else "a module that cannot be told")
        return (f"{path!r} is {origin or '?'}.{getattr(target, '__qualname__', path)}, a "
                f"function of {where}, which cadence does not call from a run file; a dotted "
                f"path here must name {expected}.")
    return (f"{path!r} is a {type(target).__name__} object, not a class or function a run file "
            f"may name; a dotted path here must name {expected}.")


def dotted_path_problem(kind: str, path: str) -> Optional[str]:
    """What is wrong with dotted path ``path`` as a ``kind``, seen without importing
    anything: a path into the standard library or builtins is refused at once; a target in
    a module already imported is checked with :func:`target_problem`. ``None`` when nothing
    is wrong or the module is not imported yet (the second stage imports it and checks the
    target before calling it)."""
    if kind not in KIND_BASES:
        return None
    module_name, attr = split_dotted_path(path)
    if not module_name or not attr:
        return None  # reported as "not a dotted import path" where it is imported
    if is_stdlib_module(module_name):
        return (f"{path!r} is in the Python standard library ({module_name}), which cadence "
                f"does not import or call from a run file; a dotted path here must name "
                f"{_expected(kind)}.")
    module = sys.modules.get(module_name)
    if module is None or not hasattr(module, attr):
        return None
    return target_problem(kind, path, getattr(module, attr))
