"""``python -m cadence ...``: the same as the ``cadence`` command (see :mod:`cadence.cli`)."""

from __future__ import annotations

from cadence.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
