"""Write ``composer_0_32_1.json``: every public name of Composer 0.32.1 that cadence answers
for, with its kind and parameter names. Run it where Composer 0.32.1 imports (it is not a
test and cadence does not need Composer)::

    python3 -m venv /tmp/capi && /tmp/capi/bin/pip install torch==2.13.0
    /tmp/capi/bin/pip install --no-deps mosaicml==0.32.1
    /tmp/capi/bin/pip install pyyaml tqdm 'torchmetrics<1.7.5' torch_optimizer requests \
        'numpy<2.3' psutil coolname tabulate==0.9.0 py-cpuinfo 'packaging<25.1' \
        importlib-metadata 'pillow<12'
    # Composer imports torchvision and mcli at module level; import-only stubs suffice:
    PYTHONPATH=<folder with stub torchvision/ and mcli/ packages> \
        /tmp/capi/bin/python tests/composer_api/dump_composer_api.py

The modules are the ones issue 20 names, plus ``algorithms`` and ``functional`` (issue 21).

With ``--llm-foundry <source folder>`` (llm-foundry 0.22.0's repository: ``llmfoundry/``,
``scripts/``, ``tests/``; issue 33), every name llm-foundry imports from Composer is added
too (read from its source with :mod:`ast`), each entry marked ``"used_by": ["llm-foundry"]``;
a name outside its module's ``__all__`` (``_split_list``) gets ``"in_all": false``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
from pathlib import Path

MODULES = [
    "composer", "composer.core", "composer.trainer", "composer.callbacks", "composer.loggers",
    "composer.optim", "composer.models", "composer.metrics", "composer.loss",
    "composer.devices", "composer.profiler", "composer.utils.dist",
    "composer.utils.reproducibility", "composer.utils.checkpoint", "composer.algorithms",
    "composer.functional",
]


def _params(obj: object) -> tuple[list[str], list[str]] | None:
    """``(parameter names, the required ones)``, without ``self``, ``*args``, ``**kwargs``."""
    target = obj.__init__ if inspect.isclass(obj) else obj  # type: ignore[misc]
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    params = [p for p in signature.parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if inspect.isclass(obj) and params[:1] and params[0].name == "self":
        params = params[1:]
    return [p.name for p in params], [p.name for p in params if p.default is p.empty]


def _kind(obj: object) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        return "function"
    return "value"


def _entry(module_name: str, name: str) -> dict[str, object]:
    module = importlib.import_module(module_name)
    obj = getattr(module, name) if hasattr(module, name) else importlib.import_module(
        f"{module_name}.{name}")
    kind = _kind(obj)
    entry: dict[str, object] = {"module": module_name, "name": name, "kind": kind}
    params = _params(obj) if kind in ("class", "function") else None
    if params is not None:
        entry["params"], entry["required"] = params
    return entry


def imported_names(source: Path) -> set[tuple[str, str]]:
    """``{(module, name)}`` of every ``from composer... import name`` under ``source``."""
    found = set()
    for path in sorted(source.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.split(".")[0] == "composer"):
                found.update((node.module, alias.name) for alias in node.names)
    return found


def main() -> None:
    import composer
    entries = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in sorted(getattr(module, "__all__", [])):
            entries.append(_entry(module_name, name))
    if "--llm-foundry" in sys.argv:
        used = imported_names(Path(sys.argv[sys.argv.index("--llm-foundry") + 1]))
        known = {(e["module"], e["name"]): e for e in entries}
        for module_name, name in sorted(used):
            entry = known.get((module_name, name))
            if entry is None:
                entry = _entry(module_name, name)
                module = importlib.import_module(module_name)
                entry["in_all"] = name in getattr(module, "__all__", ())
                entries.append(entry)
            entry["used_by"] = ["llm-foundry"]
    out = Path(__file__).with_name("composer_0_32_1.json")
    out.write_text(json.dumps({"composer_version": composer.__version__, "names": entries},
                              indent=1) + "\n")
    print(f"{len(entries)} names -> {out}")


if __name__ == "__main__":
    main()
