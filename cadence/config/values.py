"""The second stage of the run-file check: the values, with the components imported.

Runs once the schema (:mod:`cadence.config.schema`) has passed, still before
anything is built. It imports each component (the registry's built-in modules, and user
code named by a dotted path), checks the argument names and types of the components the
first stage could not see, then the values: top-level ranges and name templates, a
``load_path`` that must exist, ``device: cuda`` on a machine with CUDA, ``compile_config``,
each component's declared value checks and (for cheap kinds) its constructor (see
:mod:`cadence.registry.arg_checks`), and that ``global_train_batch_size`` divides over the
data-parallel ranks.
"""

from __future__ import annotations

import os
import string
from typing import Any, Callable, Mapping, Optional

from cadence.registry.arg_checks import Check, check_arg_values, probe
from cadence.parallel.compile_config import backend_problems
from cadence.registry.errors import ConfigProblem
from cadence.parallel.config import layer_plan_problems
from cadence.config.schema import (
    MULTI_SECTIONS, SINGLE_SECTIONS, Section, argument_problems,
)
from cadence.core.time import Time
from cadence.config.registry_index import component_spec

__all__ = ["check_values", "check_global_batch_size"]


def check_values(typed: Mapping[str, Any], world_size: Optional[int] = None) -> list[ConfigProblem]:
    """Check the values of a config whose schema passed :func:`~cadence.config.schema.
    check_schema`.

    Args:
        typed: the typed values ``check_schema`` returned (``parallelism_config`` and
            ``compile_config`` as their typed objects: only what the first stage left is
            checked here, the styles given as dotted paths and the compile backend).
        world_size: the ranks the run will have; default ``$WORLD_SIZE``, else 1.

    Returns:
        Every problem found, top-level keys in file order, then the components, then the
        global batch size.
    """
    problems: list[ConfigProblem] = []
    for key, value in typed.items():
        problems.extend(_field_value_problems(key, value))
    for section, spec in SINGLE_SECTIONS.items():
        if isinstance(typed.get(section), dict):
            kwargs = {k: v for k, v in typed[section].items() if k != "name"}
            problems.extend(_component_value_problems(
                section, typed[section]["name"], kwargs, spec, name_path=f"{section}.name"))
    for section, spec in MULTI_SECTIONS.items():
        for name, kwargs in (typed.get(section) or {}).items():
            path = f"{section}.{name}"
            problems.extend(_component_value_problems(path, name, kwargs, spec, name_path=path))
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE") or 1)
    # the batch splits over the data-parallel ranks (a tensor-parallel group shares one)
    parallelism = typed.get("parallelism_config")  # typed by the first stage
    tp = parallelism.tp_degree if parallelism is not None else 1
    problems.extend(check_global_batch_size(typed.get("global_train_batch_size"),
                                            max(1, world_size // tp)))
    return problems


def check_global_batch_size(batch: Any, world_size: int) -> list[ConfigProblem]:
    """``global_train_batch_size`` must split evenly over ``world_size`` ranks; the problem
    (naming a multiple to use instead) or ``[]``. Values of the wrong type are left to the
    type check."""
    if not isinstance(batch, int) or batch < 1 or batch % world_size == 0:
        return []
    lower = max(world_size, batch // world_size * world_size)
    return [ConfigProblem("global_train_batch_size", (
        f"{batch} does not divide evenly over {world_size} ranks; use a multiple of "
        f"{world_size} (e.g. {lower} or {lower + world_size}), or another number of ranks."))]


# ---------------------------------------------------------------------------------------------
# Top-level values.


def _positive_duration(value: str) -> bool:
    return Time.from_timestring(value).value > 0  # the schema stage parsed it


def _format_fields(allowed: tuple[str, ...], example: str) -> Callable[[str], bool]:
    """A test that a ``str.format`` template uses only the ``allowed`` fields."""
    shown = ", ".join("{" + name + "}" for name in allowed)

    def test(template: str) -> bool:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise ValueError(f"{template!r} is not a valid name template ({exc}); write fields "
                             f"as {shown}, e.g. {example!r}.") from None
        for name in fields:
            if name.split(".")[0].split("[")[0] not in allowed:
                raise ValueError(f"{template!r} has the field {{{name}}}, which is never filled "
                                 f"in; allowed fields: {shown}, e.g. {example!r}.")
        return True

    return test


def _plain_name(name: str) -> bool:
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"{name!r} would name a path outside the run's folder (run_name is "
                         f"used in folder and file names); use a plain name without '/' or "
                         f"'\\' (and not '..'), e.g. 'gpt-small-lr3e-4'.")
    return True


def _inside_save_folder(template: str) -> bool:
    parts = template.replace("\\", "/").split("/")
    if template.startswith(("/", "\\", "~")) or (len(template) > 1 and template[1] == ":"):
        raise ValueError(f"{template!r} is an absolute path; checkpoint names are relative to "
                         f"save_folder (set save_folder to write elsewhere).")
    if ".." in parts:
        raise ValueError(f"{template!r} climbs out of save_folder with '..'; checkpoint names "
                         f"stay inside save_folder (set save_folder to write elsewhere).")
    return True


def _all(*tests: Callable[[str], bool]) -> Callable[[str], bool]:
    return lambda value: all(test(value) for test in tests)


def _device_available(device: str) -> bool:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("'cuda' is not available on this machine (torch.cuda.is_available() "
                             "is False); use device: cpu, or null to take CUDA where there is one.")
    return True


def _existing_checkpoint(path: str) -> bool:
    from cadence.checkpoint.remote import check_url, is_remote, local_path

    if is_remote(path):  # its filesystem installed; the object is looked up at load time
        return check_url(path)
    local = local_path(path)
    if local.is_dir():
        from cadence.checkpoint.files import not_a_checkpoint_folder

        problem = not_a_checkpoint_folder(local)
        if problem is not None:
            raise ValueError(problem)
    if local.exists():
        return True
    raise ValueError(f"{path!r} does not exist; give the path of a checkpoint (a .pt file or a "
                     f"sharded checkpoint folder), or leave load_path unset.")


def _usable_folder(folder: str) -> bool:
    from cadence.checkpoint.remote import check_url

    return check_url(folder)  # s3://... needs s3fs: the error names the extra


#: Value checks of top-level keys beyond their type (see cadence.registry.arg_checks.Check).
_FIELD_CHECKS: dict[str, Check] = {
    "max_duration": Check(_positive_duration, "a duration > 0, e.g. '1ep' or '100ba'"),
    "run_name": Check(_plain_name, "a plain name"),
    "save_filename": Check(_all(_inside_save_folder, _format_fields(
        ("run_name", "epoch", "batch", "rank"), "ep{epoch}-ba{batch}-rank{rank}.pt")),
        "a name template"),
    "save_latest_filename": Check(_all(_inside_save_folder, _format_fields(
        ("run_name", "rank"), "latest-rank{rank}.pt")), "a name template"),
    "device": Check(_device_available, "cpu, cuda or null"),
    "load_path": Check(_existing_checkpoint, "an existing checkpoint"),
    "save_folder": Check(_usable_folder, "a local path or a URL of an installed filesystem"),
}


def _field_value_problems(key: str, value: Any) -> list[ConfigProblem]:
    """Checks on a typed top-level value beyond its schema."""
    check = _FIELD_CHECKS.get(key)
    if check is not None and value is not None:
        message = check.problem(value)
        if message is not None:
            return [ConfigProblem(key, message)]
    if key == "compile_config" and value is not None:  # stage 1 checked all but the backend
        return [ConfigProblem(path, message)
                for path, message in backend_problems(value, prefix=key)]
    if key == "parallelism_config" and value is not None:  # stage 1 left dotted-path styles
        return [ConfigProblem(path, message)
                for path, message in layer_plan_problems(value, prefix=key)]
    return []


# ---------------------------------------------------------------------------------------------
# Components.


def _component_value_problems(
    path: str, name: str, kwargs: Mapping[str, Any], section: Section, name_path: str
) -> list[ConfigProblem]:
    """Import the component, check what the schema stage could not see (a dotted path to
    user code), then the values."""
    reg = section.registry
    try:
        target = reg.get(name)
    except ValueError as exc:
        return [ConfigProblem(name_path, str(exc))]
    problems = argument_problems(path, reg.kind, name, component_spec(target), kwargs, section)
    if problems:
        return problems
    declared = check_arg_values(target, kwargs)
    if declared:
        return [ConfigProblem(f"{path}.{key}", message) for key, message in declared]
    rejected = probe(reg.kind, target, kwargs)
    if rejected is None:
        return []
    return [ConfigProblem(path, f"{reg.kind} {name!r} rejects its arguments {dict(kwargs)!r}: "
                                f"{rejected}")]
