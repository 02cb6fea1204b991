"""The run file: YAML to the typed tree, the early typo check, and a Trainer built from it.
The top of the package graph (it imports the Trainer); nothing below imports it.

- :mod:`~cadence.config.load`: ``load_config`` (YAML + ``key=value`` overrides -> ``TrainConfig``);
- :mod:`~cadence.config.schema`: the typed dataclasses, checked without importing torch;
- :mod:`~cadence.config.values`: value checks (ranges, Time strings, paths), also torch-free;
- :mod:`~cadence.config.registry_index`: the torch-free index of the names a run file can use
  (the registries themselves are :mod:`cadence.registry`, at the bottom);
- :mod:`~cadence.config.arg_types`: a registered component's argument types as plain data;
- :mod:`~cadence.config.build`: ``build_trainer`` (``TrainConfig`` -> ``Trainer``).

Each section of the tree lives with its owner: ``parallelism_config`` and ``compile_config``
in :mod:`cadence.parallel.config` and :mod:`cadence.parallel.compile_config`.

This package imports nothing on import; each module is imported where it is used.
"""

__all__: list[str] = []
