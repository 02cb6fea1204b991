"""The run file: loading YAML into typed settings, and building a Trainer from them.

- :mod:`~cadence.config.load`: ``load_config`` (YAML + ``key=value`` overrides -> ``TrainConfig``);
- :mod:`~cadence.config.schema`: the typed dataclasses, checked without importing torch;
- :mod:`~cadence.config.values`: value checks (ranges, Time strings, paths), also torch-free;
- :mod:`~cadence.config.errors`: ``ConfigError`` and the "did you mean" helper;
- :mod:`~cadence.config.registry`, :mod:`~cadence.config.registry_index`: names a run file can
  use, and the torch-free index of them;
- :mod:`~cadence.config.arg_checks`, :mod:`~cadence.config.arg_types`: argument checks and types
  of registered components;
- :mod:`~cadence.config.parallelism`, :mod:`~cadence.config.compile`: typed
  ``parallelism_config`` and ``compile_config`` (``load_config`` parses each once);
- :mod:`~cadence.config.tp_styles`: the tensor-parallel style names and the one resolver
  from a name or dotted path to a ``ParallelStyle``;
- :mod:`~cadence.config.build`: ``build_trainer`` (``TrainConfig`` -> ``Trainer``).

This package imports nothing on import; each module is imported where it is used.
"""

__all__: list[str] = []
