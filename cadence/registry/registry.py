"""Name -> class (or builder) registries for what a YAML run file can name.

A component is chosen by its registered name (``name: gpt2``) or, as the escape hatch for
user code, by a dotted import path (``name: my_pkg.models.MyModel`` or
``my_pkg.models:MyModel``).

Registries fill lazily: the first look-up imports cadence's built-in modules, whose
``@<registry>.register(...)`` decorators add their entries. The run-file check reads what
is registered from a light index instead (:mod:`cadence.config.registry_index`), plus what
this process has registered so far (:meth:`Registry.peek`), so that a typo costs no imports.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, Iterable, Iterator, Optional, TypeVar

from cadence.registry.errors import did_you_mean
from cadence.registry.targets import dotted_path_problem, target_problem

__all__ = [
    "Registry", "models", "algorithms", "callbacks", "loggers", "datasets", "optimizers",
    "schedulers", "import_object", "unknown_name_message",
]

T = TypeVar("T")

# Modules whose import registers cadence's built-in components. A package that imports its
# modules lazily (cadence.algorithms, cadence.callbacks) names them in _REGISTERING_MODULES.
_BUILTIN_MODULES = (
    "cadence.models.gpt",
    "cadence.algorithms",
    "cadence.callbacks",
    "cadence.loggers",
    "cadence.data",
    "cadence.optim.optimizers",
    "cadence.optim.scheduler",
    "cadence.optim.decoupled_weight_decay",
)
_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    for module in _BUILTIN_MODULES:
        package = importlib.import_module(module)
        for submodule in getattr(package, "_REGISTERING_MODULES", ()):
            importlib.import_module(submodule)
    _builtins_loaded = True


def unknown_name_message(kind: str, name: str, registered: Iterable[str]) -> str:
    """The error text for an unknown ``kind`` ``name``: did-you-mean plus the allowed names."""
    names = sorted(set(registered))
    return (
        f"Unknown {kind} {name!r}.{did_you_mean(name, names)} Registered {kind}s: "
        f"{', '.join(names)}; or give a dotted import path ('my_pkg.module.Name')."
    )


def import_object(path: str) -> Any:
    """Import ``pkg.mod.Name`` or ``pkg.mod:Name``.

    Raises:
        ValueError: the module or the attribute does not exist (the message names which).
    """
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{path!r} is not a dotted import path like 'my_pkg.module.Name'.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"Cannot import module {module_name!r} for {path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"Module {module_name!r} has no attribute {attr!r} (from {path!r}).") from None


class Registry(Generic[T]):
    """A name -> object registry for one kind of component.

    Args:
        kind: what it holds, used in messages (``"model"``, ``"callback"``...).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: Optional[T] = None) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator.

        Raises:
            ValueError: ``name`` is already registered to another object.
        """
        def add(item: T) -> T:
            existing = self._entries.get(name)
            if existing is not None and existing is not item:
                raise ValueError(f"{self.kind} {name!r} is already registered to {existing!r}.")
            self._entries[name] = item
            return item

        if obj is not None:
            return add(obj)
        return add

    def get(self, name: str) -> T:
        """Look up ``name``: a registered name, or a dotted import path to what this kind can
        hold (:mod:`cadence.registry.targets`: a path into the standard library is refused
        before it is imported, any other target before it is returned).

        Raises:
            ValueError: unknown name (the message lists the registered names and the closest
                match), or a dotted path to something this kind cannot hold (naming it).
        """
        _load_builtins()
        if name in self._entries:
            return self._entries[name]
        if "." in name or ":" in name:
            refused = dotted_path_problem(self.kind, name)  # the standard library: not imported
            if refused is not None:
                raise ValueError(refused)
            target = import_object(name)
            refused = target_problem(self.kind, name, target)  # checked before it is called
            if refused is not None:
                raise ValueError(refused)
            return target
        raise ValueError(self.unknown_message(name))

    def unknown_message(self, name: str) -> str:
        """The error text for an unknown ``name``: did-you-mean plus the allowed names."""
        _load_builtins()
        return unknown_name_message(self.kind, name, self._entries)

    def peek(self, name: str) -> Optional[T]:
        """What this process has registered as ``name`` so far, or ``None``; unlike
        :meth:`get`, imports nothing (the built-in modules may not be loaded yet)."""
        return self._entries.get(name)

    def names_so_far(self) -> list[str]:
        """The names this process has registered so far, sorted; imports nothing."""
        return sorted(self._entries)

    def names(self) -> list[str]:
        """All registered names, sorted."""
        _load_builtins()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        _load_builtins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def items(self) -> list[tuple[str, T]]:
        _load_builtins()
        return sorted(self._entries.items())


models: Registry[Callable[..., Any]] = Registry("model")
algorithms: Registry[Callable[..., Any]] = Registry("algorithm")
callbacks: Registry[Callable[..., Any]] = Registry("callback")
loggers: Registry[Callable[..., Any]] = Registry("logger")
datasets: Registry[Callable[..., Any]] = Registry("dataset")
optimizers: Registry[Callable[..., Any]] = Registry("optimizer")
schedulers: Registry[Callable[..., Any]] = Registry("scheduler")
