"""The type a component argument takes, as plain data, and whether a YAML value fits it.

A run file's component arguments (``model: {name: gpt2, n_layer: 4}``) are checked against
the component's annotations. The annotation is first turned into a *type spec*
(:func:`type_spec`), a dict of plain values, so the check can run from the checked-in index
of registered components (:mod:`cadence.config.registry_index`) without importing the
component, and the same way when the component itself is at hand. A spec (keys other
than ``describe`` are left out when false or empty)::

    {"describe": "an int or null",   # the expected type, in words, for messages
     "null": True,                     # null is allowed (Optional, or a None default)
     "members": [{"type": "int"}],     # what a non-null value may be; absent: not checked
     "time": True,                     # a str that must parse as a Time string
     "choices": ["relu", "gelu"],      # every member is a Literal/Enum: the allowed values
     "tuple": {...}}                   # a tuple: {"items": [spec|None], "describe": [...],
                                       #           "variadic": bool}

Members are ``{"type": "bool"|"int"|"float"|"str"|"time"}`` or ``{"accept": [...]}`` (a
``Literal`` or an ``Enum``: the values, and an Enum's member names). Simple annotations are
checked: ``bool``, ``int``, ``float``, ``str``, :class:`~cadence.Time`, ``Literal[...]``, an
``Enum``, ``tuple[X, Y]`` / ``tuple[X, ...]`` and ``Optional``/``Union`` of these; a ``str``
parameter whose default is a Time string (``t_warmup="0ba"``) takes Time strings; a torch
``Tensor`` member is ignored (a YAML value is never one). Anything else is not guessed at:
only null is checked.

This module imports only the standard library and :mod:`cadence.core.time`.
"""

from __future__ import annotations

import enum
import inspect
import types
import typing
from typing import Any, Dict, Literal, Optional, Union

from cadence.registry.errors import choice_message, show
from cadence.core.time import Time

__all__ = ["type_spec", "mismatch", "describe"]

_SIMPLE = {bool: "bool", int: "int", float: "float", str: "str"}


def type_spec(hint: Any, default: Any = inspect.Parameter.empty) -> Optional[dict[str, Any]]:
    """The spec of an argument annotated ``hint`` with default ``default``; ``None`` when
    nothing can be checked (no annotation, ``Any``, only ``None``/Tensor members)."""
    if hint is None or hint is Any:
        return None
    members = typing.get_args(hint) if _is_union(hint) else (hint,)
    allow_none = type(None) in members
    members = tuple(m for m in members if m is not type(None) and not _is_tensor_type(m))
    if not members:
        return None
    whole = Union[members + ((type(None),) if allow_none else ())]  # type: ignore[valid-type]
    spec: dict[str, Any] = {"describe": describe(whole)}
    if allow_none or default is None:
        spec["null"] = True
    if len(members) == 1 and typing.get_origin(members[0]) is tuple:
        args = typing.get_args(members[0])
        variadic = len(args) == 2 and args[1] is Ellipsis
        spec["tuple"] = {"variadic": variadic,
                         "items": [type_spec(a) for a in (args[:1] if variadic else args)],
                         "describe": [describe(a) for a in (args[:1] if variadic else args)]}
        return spec
    if not all(_is_choice(m) or m is Time or m in _SIMPLE for m in members):
        return spec  # not a simple annotation: do not guess
    if Time in members or (str in members and _is_time_default(default)):
        spec["time"] = True
    spec["members"] = [{"accept": _accepted(m)} if _is_choice(m)
                       else {"type": "time" if m is Time else _SIMPLE[m]} for m in members]
    if all(_is_choice(m) for m in members):
        spec["choices"] = [str(c) for m in members for c in _choices(m)]
    return spec


def mismatch(spec: Optional[dict[str, Any]], value: Any) -> Optional[str]:
    """What ``value`` should have been (``"is not an int."``), or ``None`` when it fits."""
    if spec is None:
        return None
    if value is None:
        return None if spec.get("null") else f"is not allowed; expected {spec['describe']}."
    if "tuple" in spec:
        return _tuple_mismatch(spec["tuple"], value)
    if "members" not in spec:
        return None
    if spec.get("time") and isinstance(value, str):
        try:
            Time.from_timestring(value)
        except ValueError as exc:
            return f"is not a valid Time string: {exc}"
        return None
    plain = value.value if isinstance(value, enum.Enum) else value
    for member in spec["members"]:
        if "accept" in member:
            if plain in member["accept"]:
                return None
        elif member["type"] != "time" and _matches(member["type"], value):
            return None
    if "choices" in spec:
        return choice_message(value, spec["choices"], prefix=False)
    return f"is not {spec['describe']}."


def _tuple_mismatch(spec: dict[str, Any], value: Any) -> Optional[str]:
    """``tuple[X, Y]`` (exactly two items) or ``tuple[X, ...]`` (any number) against a YAML
    list: its length, then each item against its spec."""
    items, names = spec["items"], spec["describe"]
    if spec["variadic"]:
        wanted = f"a list of values, each {names[0]}"
    else:
        wanted = (f"a list of exactly {len(items)} value{'s' if len(items) != 1 else ''} "
                  f"({', '.join(names)})")
    if not isinstance(value, (list, tuple)):
        return f"is not {wanted}."
    if not spec["variadic"] and len(value) != len(items):
        return f"has {len(value)} item{'s' if len(value) != 1 else ''}; expected {wanted}."
    for index, item in enumerate(value):
        problem = mismatch(items[0] if spec["variadic"] else items[index], item)
        if problem is not None:
            return f"item {index}: {show(item)} {problem}"
    return None


def _matches(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)


def _is_time_default(default: Any) -> bool:
    if not isinstance(default, str):
        return False
    try:
        Time.from_timestring(default)
    except ValueError:
        return False
    return True


def _is_tensor_type(hint: Any) -> bool:
    return getattr(hint, "__name__", None) == "Tensor" and str(
        getattr(hint, "__module__", "")).startswith("torch")


def _is_choice(hint: Any) -> bool:
    return typing.get_origin(hint) is Literal or (
        inspect.isclass(hint) and issubclass(hint, enum.Enum))


def _choices(hint: Any) -> list[Any]:
    if typing.get_origin(hint) is Literal:
        return list(typing.get_args(hint))
    return [m.value for m in hint]


def _accepted(hint: Any) -> list[Any]:
    if typing.get_origin(hint) is Literal:
        return list(typing.get_args(hint))
    return [m.value for m in hint] + [m.name for m in hint]


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) is Union or isinstance(hint, types.UnionType)


def describe(hint: Any) -> str:
    """An annotation in words: ``Optional[int]`` -> ``'an int or null'``."""
    members = typing.get_args(hint) if _is_union(hint) else (hint,)
    names = []
    for member in members:
        if _is_tensor_type(member):
            continue  # a YAML value is never a tensor
        if member is type(None):
            names.append("null")
        elif typing.get_origin(member) is Literal:
            names.append("one of " + ", ".join(repr(a) for a in typing.get_args(member)))
        elif inspect.isclass(member) and issubclass(member, enum.Enum):
            names.append("one of " + ", ".join(str(m.value) for m in member))
        elif member is Time:
            names.append("a Time string (e.g. '100ba')")
        elif typing.get_origin(member) in (dict, Dict) or member is dict:
            names.append("a mapping")
        elif typing.get_origin(member) in (list, tuple) or member in (list, tuple):
            names.append("a list")
        else:
            name = getattr(member, "__name__", str(member))
            names.append(f"{'an' if name[:1] in 'aeiou' else 'a'} {name}")
    # null last reads better: "an int or null"
    names.sort(key=lambda n: n == "null")
    return " or ".join(names)
