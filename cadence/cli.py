"""The ``cadence`` command line.

::

    cadence train RUN.yaml [key=value ...]     # e.g. cadence train yamls/quickstart.yaml seed=3

``train`` loads the run file, applies the ``key=value`` overrides (dotted keys, YAML values,
as in OmegaConf's dotlist), checks everything (see :func:`~cadence.trainer.config.load_config`),
builds the Trainer (:func:`~cadence.trainer.build.build_trainer`) and calls ``fit()`` then
``close()``. A bad config prints every problem to stderr and exits with status 2, before
any model or data is built.

More subcommands (``launch``, ``convert``) are added as a function ``_add_<name>(subparsers)``
each, registered in :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional, Sequence

__all__ = ["main", "build_parser"]

#: Exit status for a bad run config or bad arguments (argparse uses 2 for usage errors too).
EXIT_CONFIG_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    """The ``cadence`` argument parser, one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="cadence",
        description="Train PyTorch models from YAML run files (Composer-style events, "
                    "algorithms and callbacks).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(subparsers)
    return parser


def _add_train(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train",
        help="train from a YAML run file",
        description="Train from a YAML run file, with optional key=value overrides.",
        epilog="example: cadence train yamls/quickstart.yaml seed=3 model.n_layer=2 "
               "max_duration=100ba",
    )
    train.add_argument("config", metavar="RUN.yaml", help="the run file")
    train.add_argument(
        "overrides", nargs="*", metavar="key=value",
        help="override a config value with a dotted key and a YAML value, e.g. "
             "optimizer.lr=1e-3 or callbacks.lr_monitor={}",
    )
    train.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    # Imported when a run starts, not when the parser is built.
    from cadence.trainer.build import build_trainer
    from cadence.trainer.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
        trainer = build_trainer(cfg)
    except ConfigError as exc:
        print(f"cadence train: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        trainer.fit()
    finally:
        trainer.close()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ``cadence`` command line.

    Args:
        argv: the arguments after the program name; default ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 2 for bad arguments or a bad run config.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2): return instead of exiting
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_CONFIG_ERROR
    return int(args.func(args))
