"""``python -m cadence ...``: the same as the ``cadence`` command (see :mod:`cadence.cli`)."""

from __future__ import annotations

from cadence.cli import exit_now, main

__all__: list[str] = []

if __name__ == "__main__":
    exit_now(main())
