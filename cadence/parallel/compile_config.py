"""The ``compile`` settings of a run, parsed without importing torch (the run file's first
check stage uses them; :mod:`cadence.parallel.compile` applies them and re-exports
every name here). Only the ``backend`` name needs torch (dynamo's list of backends): it is
checked when ``check_backend`` is true, as the second stage and the Trainer do.

Source: ``torch.compile`` (PyTorch docs) for the settings and their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional, Union

from cadence.registry.errors import ConfigError, ConfigProblem, did_you_mean

__all__ = ["CompileConfig", "COMPILE_MODES", "parse_compile_config", "check_compile_config",
           "compile_config_problems", "backend_problems"]

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``torch.compile`` modes (inductor's); any but ``default`` needs ``backend: inductor``."""

_BOOL_KEYS = ("enabled", "fullgraph", "per_block")


@dataclass
class CompileConfig:
    """How to compile the model. See the module docstring for the run-file form.

    Attributes:
        enabled: compile at all; default True (a ``compile`` section turns it on; set
            ``enabled: false`` to keep the section but run eagerly).
        mode: one of :data:`COMPILE_MODES`; default ``"default"``.
        fullgraph: refuse graph breaks (``torch.compile(fullgraph=True)``): a block that
            cannot be traced whole raises at its first call instead of running in pieces.
        dynamic: ``True`` traces shapes symbolically from the start, ``False`` specialises
            on every shape, ``None`` (default) specialises first and goes dynamic on a
            recompile.
        backend: a dynamo backend name; default ``"inductor"``. ``"aot_eager"`` and
            ``"eager"`` run the same tracing without code generation (for debugging and
            fast tests).
        per_block: compile each transformer block (default, torchtitan's choice: small
            graphs, one compile shared by identical blocks, and FSDP2's per-block hooks
            fall between graphs) instead of the whole model.
    """

    enabled: bool = True
    mode: str = "default"
    fullgraph: bool = False
    dynamic: Optional[bool] = None
    backend: str = "inductor"
    per_block: bool = True

    def __post_init__(self) -> None:
        """Check every setting that differs from its default with the run file's own checks
        (the ``backend`` name against dynamo's list is left to :func:`backend_problems`, as in
        the run file's torch-free first stage).

        Raises:
            ConfigError: each bad value named by its key path (``compile_config.mode``), with
                the allowed values and a "did you mean".
        """
        changed = {f.name: getattr(self, f.name) for f in fields(self)
                   if getattr(self, f.name) != f.default}
        values, problems = _values(changed, "compile_config", check_backend=False)
        if problems:
            raise ConfigError([ConfigProblem(key, message) for key, message in problems])
        for key, value in values.items():
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a run file would write them (the run's ``hyperparameters``): the
        keys whose values differ from the defaults."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != f.default}

    def compile_kwargs(self) -> dict[str, Any]:
        """The keyword arguments for ``torch.compile`` / ``nn.Module.compile``."""
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph,
                                  "dynamic": self.dynamic}
        if self.mode != "default":
            kwargs["mode"] = self.mode
        return kwargs


def _dynamo_backends() -> list[str]:
    import torch._dynamo

    return sorted(torch._dynamo.list_backends(exclude_tags=()))


def parse_compile_config(
    raw: Union[None, Mapping[str, Any], CompileConfig], prefix: str = "compile",
    check_backend: bool = True,
) -> Optional[CompileConfig]:
    """Validate ``raw`` into a :class:`CompileConfig` (``None`` stays ``None``: no compile).

    Args:
        raw: ``None``, a :class:`CompileConfig` (typed already, e.g. by
            :func:`~cadence.config.load.load_config`: returned as it is), or a dict with any
            of the keys ``enabled``, ``mode``, ``fullgraph``, ``dynamic``, ``backend``,
            ``per_block``.
        prefix: the key path used in error messages.
        check_backend: check ``backend`` against dynamo's backends (imports
            ``torch._dynamo``); false: only that it is a string (the torch-free first stage).

    Raises:
        ValueError: every problem at once (see :func:`compile_config_problems`).
    """
    if isinstance(raw, CompileConfig):
        return raw
    config, problems = _parse(raw, prefix, check_backend)
    if problems and problems[0][0] == prefix:  # not a dict at all
        raise ValueError(f"{prefix} {problems[0][1]}")
    if problems:
        raise ValueError(f"{len(problems)} problem(s) in {prefix}:\n"
                         + "\n".join(f"  - {path}: {message}" for path, message in problems))
    return config


def check_compile_config(raw: Any, prefix: str = "compile_config", check_backend: bool = True,
                         ) -> tuple[Optional[CompileConfig], list[tuple[str, str]]]:
    """Like :func:`parse_compile_config`, but returns ``(config, problems)``, each problem a
    ``(key path, message)``; the config holds the valid settings only. A
    :class:`CompileConfig` given is checked field by field (a config built in Python).
    ``check_backend`` as in :func:`parse_compile_config`."""
    return _parse(raw, prefix, check_backend)


def backend_problems(config: Optional[CompileConfig], prefix: str = "compile_config",
                     ) -> list[tuple[str, str]]:
    """The check the torch-free first stage leaves to the second: ``backend`` against
    dynamo's backends (imports ``torch._dynamo``).

    Args:
        config: a typed config (from :func:`check_compile_config` with
            ``check_backend=False``), or None.
        prefix: the key path used in messages.

    Returns:
        ``[(f"{prefix}.backend", message)]`` for a backend dynamo does not know, else ``[]``.
    """
    if config is None:
        return []
    return _backend_problems(config.backend, f"{prefix}.backend")


def _backend_problems(value: str, where: str) -> list[tuple[str, str]]:
    backends = _dynamo_backends()
    if value in backends:
        return []
    return [(where, f"{value!r} is not a dynamo backend; allowed: {', '.join(backends)}."
                    f"{did_you_mean(value, backends)}")]


def compile_config_problems(raw: Any, prefix: str = "compile_config",
                            check_backend: bool = True) -> list[tuple[str, str]]:
    """Every problem in ``raw`` as ``(key path, message)``, each naming the bad value and the
    allowed values (with a "did you mean" for near misses): an unknown key, a non-bool flag,
    an unknown mode or backend, or a mode other than ``default`` with a backend other than
    ``inductor``. ``check_backend`` as in :func:`parse_compile_config`."""
    return _parse(raw, prefix, check_backend)[1]


def _parse(raw: Any, prefix: str, check_backend: bool
           ) -> tuple[Optional[CompileConfig], list[tuple[str, str]]]:
    if raw is None:
        return None, []
    if isinstance(raw, CompileConfig):
        raw = {f.name: getattr(raw, f.name) for f in fields(CompileConfig)}
    if not isinstance(raw, Mapping):
        return None, [(prefix, f"must be a dict like {{'enabled': True, 'per_block': True}} or "
                               f"None, got {raw!r} ({type(raw).__name__}).")]
    values, problems = _values(raw, prefix, check_backend)
    return CompileConfig(**values), problems


def _values(raw: Mapping[str, Any], prefix: str, check_backend: bool,
            ) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The one check of compile settings (run file and :meth:`CompileConfig.__post_init__`):
    the valid values of ``raw`` by field name, and ``(key path, message)`` problems."""
    names = [f.name for f in fields(CompileConfig)]
    problems: list[tuple[str, str]] = []
    config: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{prefix}.{key}"
        if key not in names:
            problems.append((where, f"unknown key.{did_you_mean(str(key), names)} "
                                    f"Allowed: {', '.join(names)}."))
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                problems.append((where, f"{value!r} ({type(value).__name__}) must be true or "
                                        f"false."))
            else:
                config[key] = value
        elif key == "dynamic":
            if value is not None and not isinstance(value, bool):
                problems.append((where, f"{value!r} must be true, false or null (let dynamo "
                                        f"decide)."))
            else:
                config["dynamic"] = value
        elif key == "mode":
            text = "default" if value is None else value
            if text not in COMPILE_MODES:
                problems.append((where, f"{value!r} is not one of: {', '.join(COMPILE_MODES)}."
                                        f"{did_you_mean(str(text), COMPILE_MODES)}"))
            else:
                config["mode"] = text
        elif key == "backend":
            if not isinstance(value, str):
                problems.append((where, f"{value!r} must be a dynamo backend name (a string)."))
                continue
            rejected = _backend_problems(value, where) if check_backend else []
            if rejected:
                problems.extend(rejected)
            else:
                config["backend"] = value
    mode, backend = config.get("mode", "default"), config.get("backend", "inductor")
    if not problems and mode != "default" and backend != "inductor":
        problems.append((f"{prefix}.mode", f"{mode!r} is an inductor mode, but backend is "
                                           f"{backend!r}; use backend: inductor or mode: "
                                           f"default."))
        del config["mode"]  # the config holds valid settings only
    return config, problems
