"""The ``cadence`` command line.

::

    cadence train RUN.yaml [key=value ...]     # e.g. cadence train yamls/quickstart.yaml seed=3
    cadence launch -n 2 RUN.yaml [key=value ...]   # the same on 2 ranks, through torchrun
    cadence convert CHECKPOINT --to hf OUT_DIR     # model.safetensors + config (+ tokenizer)
    cadence convert CHECKPOINT --to full OUT.pt    # merge a sharded checkpoint into one file
    cadence plot RUN_DIR [RUN_DIR ...] [--metrics a,b] [-o plot.png]   # compare runs' metrics
    cadence plan RUN.yaml [key=value ...] --world-size 64 --gpu h100-sxm   # will it fit?

``train`` loads the run file, applies the ``key=value`` overrides (dotted keys, YAML values,
as in OmegaConf's dotlist), checks everything (see :func:`~cadence.config.load.load_config`),
builds the Trainer (:func:`~cadence.config.build.build_trainer`) and calls ``fit()`` then
``close()``. A bad config prints every problem to stderr and exits with status 2, before
any model or data is built; a schema problem (a typo in a key, a name or an argument, a
wrong type) before torch is even imported.

``launch`` checks the run file the same way, then starts ``N`` ranks with
``torch.distributed.run`` (torchrun), each running ``cadence train``. One node picks a free
port itself; several nodes pass ``--nnodes``, ``--node_rank``, ``--master_addr`` and
``--master_port`` (or ``--rdzv_backend c10d --rdzv_endpoint HOST:PORT``) as torchrun takes
them; under SLURM what is not given comes from the job (:func:`torchrun_argv`,
:mod:`cadence.launch.slurm`). ``--max_restarts N`` restarts the whole group after a rank
fails, up to ``N`` times (torchrun's, on the static or c10d rendezvous: never
``--standalone``, whose restarts fail to connect); with ``autoresume: true`` each restart
resumes from the newest verified checkpoint, and after the last one the launch names every
attempt's first error (:mod:`cadence.launch.restarts`). When a rank fails, torchrun stops
the others and prints the failing rank's traceback; the exit status is then 1. A rank killed
by a signal is named with its signal first; a rank that stops answering fails every
collective after ``dist_timeout`` seconds, and the surviving ranks name it. The ranks die with the launch:
``SIGKILL`` on ``cadence launch`` kills them too (:mod:`cadence.launch.rank_health`).
A preemption signal (``SIGTERM``, ``SIGUSR1``, ...) is forwarded to every rank, which
checkpoints and exits ``128 + signal`` (:mod:`cadence.trainer.preemption`); ``cadence
launch`` then exits with that status too.

More subcommands are added as a function ``_add_<name>(subparsers)`` each, registered in
:func:`build_parser`.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
from typing import Mapping, NoReturn, Optional, Sequence

__all__ = ["main", "run", "exit_now", "build_parser", "torchrun_argv"]

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
    _add_launch(subparsers)
    _add_convert(subparsers)
    _add_plot(subparsers)
    _add_plan(subparsers)
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
    train.set_defaults(func=_train_recorded)


def _add_launch(subparsers: argparse._SubParsersAction) -> None:
    launch = subparsers.add_parser(
        "launch",
        help="train on several ranks (a thin front on torchrun)",
        description="Check the run file, then start N ranks of `cadence train` with "
                    "torch.distributed.run (torchrun).",
        epilog="example: cadence launch -n 2 yamls/gpt_fsdp.yaml max_duration=20ba",
    )
    launch.add_argument("-n", "--nproc_per_node", type=int, required=True,
                        help="ranks (processes) on this node")
    launch.add_argument("--nnodes", type=int, default=None,
                        help="number of nodes (default: SLURM's node count under SLURM, else 1)")
    launch.add_argument("--node_rank", type=int, default=None,
                        help="this node's rank, static rendezvous (default: SLURM_NODEID, else 0)")
    launch.add_argument("--master_addr", default=None,
                        help="address of the rank-0 node, static rendezvous (default: the first "
                             "host of SLURM's node list, else 127.0.0.1)")
    launch.add_argument("--master_port", type=int, default=None,
                        help="port on the rank-0 node (default: 15000 + SLURM_JOB_ID %% 10000 "
                             "under SLURM, else a free port on one node)")
    launch.add_argument("--rdzv_backend", default="static",
                        help="torchrun's rendezvous: static (default: --node_rank, "
                             "--master_addr, --master_port) or c10d (node ranks assigned at "
                             "--rdzv_endpoint)")
    launch.add_argument("--rdzv_endpoint", default=None, metavar="HOST:PORT",
                        help="the c10d rendezvous (default: as --master_addr:--master_port)")
    launch.add_argument("--rdzv_id", default=None,
                        help="the job's id at the rendezvous (default: SLURM_JOB_ID, else "
                             "torchrun's 'none')")
    launch.add_argument("--rdzv_conf", default=None, metavar="K=V,...",
                        help="torchrun's --rdzv_conf, e.g. join_timeout=600")
    launch.add_argument("--max_restarts", type=int, default=0,
                        help="restart the whole group up to N times after a rank fails; each "
                             "restart resumes from the newest verified checkpoint with "
                             "autoresume: true (default 0: the job fails at once)")
    launch.add_argument("config", metavar="RUN.yaml", help="the run file")
    launch.add_argument("overrides", nargs="*", metavar="key=value",
                        help="overrides, as for `cadence train`")
    launch.set_defaults(func=_launch)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_argv(args: argparse.Namespace, environ: Mapping[str, str]) -> list[str]:
    """The torchrun command line for ``cadence launch`` arguments ``args``.

    What ``args`` leaves unset (``None``) comes from SLURM when ``environ`` describes a
    SLURM task (:func:`cadence.launch.slurm.slurm_nodes`): the node count, this node's rank,
    the rank-0 address (the node list's first host) and port (``15000 + SLURM_JOB_ID %
    10000``), and the c10d rendezvous id (``SLURM_JOB_ID``). Otherwise one node on
    ``127.0.0.1`` and a free port. ``--rdzv_backend c10d`` uses ``--rdzv_endpoint`` (default
    ``master_addr:master_port`` as above) and lets the rendezvous number the nodes.

    Args:
        args: the parsed ``cadence launch`` arguments.
        environ: the environment, e.g. ``os.environ``.

    Returns:
        The arguments of ``torch.distributed.run``, ending in ``-m cadence train RUN.yaml
        key=value ...``.

    Raises:
        ValueError: a bad count or rank, several nodes without a rank-0 port or rendezvous
            endpoint, a static-only option with c10d (or the reverse), or a SLURM variable
            that cannot be read; the message names the option and the fix.
    """
    from cadence.launch.slurm import slurm_nodes

    slurm = slurm_nodes(environ)
    nnodes = args.nnodes if args.nnodes is not None else slurm.nnodes if slurm else 1
    multi_slurm = slurm if slurm is not None and nnodes > 1 else None
    max_restarts = getattr(args, "max_restarts", 0)
    if max_restarts < 0:
        raise ValueError(f"need --max_restarts >= 0 (got {max_restarts}); 0 fails the job at "
                         f"the first rank failure.")
    if args.nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"need -n >= 1 and --nnodes >= 1 (got -n {args.nproc_per_node}, "
                         f"--nnodes {nnodes}).")
    addr = (args.master_addr if args.master_addr is not None
            else multi_slurm.master_addr if multi_slurm else "127.0.0.1")
    port = (args.master_port if args.master_port is not None
            else multi_slurm.master_port if multi_slurm else None)
    if port is None and nnodes == 1:
        port = _free_port()
    head = [f"--nproc_per_node={args.nproc_per_node}", f"--nnodes={nnodes}"]
    tail = [f"--max_restarts={max_restarts}", "--monitor_interval=0.5",
            "-m", "cadence", "train", args.config, *args.overrides]
    if args.rdzv_backend == "static":
        if args.rdzv_endpoint is not None or args.rdzv_id is not None:
            raise ValueError("--rdzv_endpoint and --rdzv_id are for --rdzv_backend c10d; the "
                             "static rendezvous meets at --master_addr:--master_port.")
        node_rank = (args.node_rank if args.node_rank is not None
                     else multi_slurm.node_rank if multi_slurm else 0)
        if not 0 <= node_rank < nnodes:
            raise ValueError(f"need 0 <= --node_rank < --nnodes (got --node_rank {node_rank}, "
                             f"--nnodes {nnodes}).")
        if port is None:
            raise ValueError("--master_port is required with --nnodes > 1 outside SLURM (every "
                             "node must name the same rank-0 address and port).")
        return [*head, f"--node_rank={node_rank}", f"--master_addr={addr}",
                f"--master_port={port}", *(["--rdzv_conf", args.rdzv_conf]
                                           if args.rdzv_conf else []), *tail]
    if args.node_rank is not None or args.master_addr is not None:
        raise ValueError(f"--node_rank and --master_addr are for the static rendezvous; with "
                         f"--rdzv_backend {args.rdzv_backend} the nodes meet at "
                         f"--rdzv_endpoint HOST:PORT, which numbers them.")
    endpoint = args.rdzv_endpoint or (f"{addr}:{port}" if port is not None else None)
    if endpoint is None:
        raise ValueError(f"--rdzv_endpoint HOST:PORT is required with --rdzv_backend "
                         f"{args.rdzv_backend} and --nnodes > 1 outside SLURM.")
    rdzv_id = args.rdzv_id if args.rdzv_id is not None else (
        multi_slurm.job_id if multi_slurm else None)
    return [*head, f"--rdzv_backend={args.rdzv_backend}", f"--rdzv_endpoint={endpoint}",
            *([f"--rdzv_id={rdzv_id}"] if rdzv_id else []),
            *(["--rdzv_conf", args.rdzv_conf] if args.rdzv_conf else []), *tail]


def _launch(args: argparse.Namespace) -> int:
    import os

    from cadence.config.load import ConfigError, load_config

    try:
        argv = torchrun_argv(args, os.environ)
    except ValueError as exc:
        print(f"cadence launch: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    nnodes = int(next(a for a in argv if a.startswith("--nnodes=")).partition("=")[2])
    try:  # fail on a bad run file, or a batch size the ranks do not divide, before any rank;
        # a schema problem (a typo) is found before torch is imported (issue 15)
        cfg = load_config(args.config, args.overrides,
                          world_size=args.nproc_per_node * nnodes)
    except ConfigError as exc:
        print(f"cadence launch: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from cadence.launch.rank_health import LAUNCHER_PID_ENV, RankWatcher
    from cadence.launch.restarts import AttemptRecorder

    torchrun_args = get_args_parser().parse_args(argv)
    if torchrun_args.rdzv_backend == "static" and torchrun_args.rdzv_id == "none":
        # one id per job, the same for all its attempts (TORCHELASTIC_RUN_ID): a restarted
        # group takes over the save folder's lock of its own earlier attempt. Every node must
        # name the same id (the static store's prefix): one node makes one up, several take
        # SLURM's job id, else stay anonymous (the lock's other rules apply)
        import uuid

        job = os.environ.get("SLURM_JOB_ID", "")
        torchrun_args.rdzv_id = (f"cadence-{uuid.uuid4().hex[:12]}" if nnodes == 1
                                 else f"slurm-{job}" if job.isdigit() else "none")
    # the agent forwards these to every rank, and waits the save out before SIGKILL
    torchrun_args.signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
    torchrun_args.shutdown_timeout = int(cfg.preemption_timeout) + 30
    if nnodes > 1:  # every node prints how it meets the others: a mismatch shows at once
        print(f"cadence launch: torchrun {' '.join(argv[:argv.index('-m')])}", file=sys.stderr)
    # Workers tie their life to this process (see cadence.launch.rank_health); the watcher
    # names a rank killed by a signal, and kills a stopped rank once the job has failed.
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    watcher = RankWatcher()
    watcher.start()
    from cadence.trainer.preemption import parse_signals

    # a rank that saved and exited 128 + a preemption signal is not a failure: no restart
    recorder = AttemptRecorder((128 + int(sig) for sig in
                                parse_signals(getattr(cfg, "preemption_signals", ()))),
                               before_monitor=watcher.check)
    try:
        with recorder:
            run(torchrun_args)
    except SignalException as exc:  # forwarded to the ranks, which saved and exited
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:  # a rank preempted alone (its status) or a failure
        first = exc.get_first_failure()[1].exitcode
        if 128 < first <= 128 + 31 and _preempted(first - 128, cfg):
            return first
        if args.max_restarts > 0 and recorder.errors:  # torchrun shows the last attempt only
            print(f"cadence launch: {recorder.summary(args.max_restarts)}", file=sys.stderr)
        return 1
    finally:
        watcher.stop()
    return 0


def _preempted(signum: int, cfg: object) -> bool:
    """Whether ``signum`` is one of the run's ``preemption_signals``."""
    from cadence.trainer.preemption import parse_signals

    return signum in parse_signals(getattr(cfg, "preemption_signals", ()))


def _add_convert(subparsers: argparse._SubParsersAction) -> None:
    convert = subparsers.add_parser(
        "convert",
        help="export a checkpoint (to Hugging Face format, or to one full file)",
        description="Export a full or sharded checkpoint: --to hf writes model.safetensors, "
                    "config.json and the tokenizer for from_pretrained; --to full merges a "
                    "sharded checkpoint into one file. A full .pt written by Composer 0.32 is "
                    "accepted too (--to full makes it a cadence checkpoint, with checksums).",
    )
    convert.add_argument("checkpoint", help="a full .pt file (cadence's or Composer's) or a "
                                            "sharded checkpoint directory (or its URL: "
                                            "s3://bucket/runs/x/ep1-ba8)")
    convert.add_argument("--to", choices=("hf", "full"), required=True, help="output format")
    convert.add_argument("out", help="output directory (hf) or file (full); a URL uploads it")
    convert.add_argument("--merge", action="store_true",
                         help="with --to hf, for a LoRA/peft run: write the adapter merged into "
                              "the base (a full model) instead of the peft adapter folder")
    convert.set_defaults(func=_convert)


def _add_plot(subparsers: argparse._SubParsersAction) -> None:
    plot = subparsers.add_parser(
        "plot",
        help="plot metrics of one or more runs from their metrics.jsonl",
        description="Draw the chosen metrics of one or several runs (the `file` logger's "
                    "metrics.jsonl) against the optimizer step, one panel per metric, one "
                    "line per run (needs matplotlib: pip install 'cadence[plot]').",
        epilog="example: cadence plot runs/quickstart runs/quickstart-lr1e-3 "
               "--metrics loss/train/total,metrics/eval/LanguagePerplexity -o compare.png",
    )
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR",
                      help="a run's folder (holding metrics.jsonl) or a .jsonl file")
    plot.add_argument("--metrics", default=None,
                      help="comma-separated metric names (default: loss/train/total and every "
                           "metrics/... the runs logged)")
    plot.add_argument("-o", "--output", default="plot.png",
                      help="image file to write; .png, .svg or .pdf (default plot.png)")
    plot.add_argument("--width", type=int, default=900, help="width in pixels (900)")
    plot.add_argument("--panel-height", type=int, default=300,
                      help="height of each metric's panel in pixels (300)")
    plot.set_defaults(func=_plot)


def _add_plan(subparsers: argparse._SubParsersAction) -> None:
    plan = subparsers.add_parser(
        "plan",
        help="will it fit? simulate the run on N fake ranks (no GPU needed)",
        description="Apply the run's real parallelize plan as rank r of N on a fake process "
                    "group, run one training step on fake tensors under PyTorch's memory "
                    "tracker, and print each rank's memory, the collectives, an estimated "
                    "step time and MFU, and, when it does not fit, the first change that does "
                    "(cadence.planning).",
        epilog="example: cadence plan yamls/gpt_fsdp.yaml --world-size 8 --gpu a100-80gb",
    )
    plan.add_argument("config", metavar="RUN.yaml", nargs="?", help="the run file")
    plan.add_argument("overrides", nargs="*", metavar="key=value",
                      help="overrides, as for `cadence train`")
    plan.add_argument("--world-size", type=int, default=None, help="ranks in the job")
    plan.add_argument("--nnodes", type=int, default=1, help="nodes (default 1)")
    plan.add_argument("--gpu", default=None,
                      help="device from the table (default h100-sxm; --list-gpus shows it)")
    plan.add_argument("--peak-tflops", type=float, default=None,
                      help="dense peak TFLOP/s at the run's precision (overrides --gpu's)")
    plan.add_argument("--memory-gib", type=float, default=None, help="device memory, GiB")
    plan.add_argument("--intra-node-gbps", type=float, default=None,
                      help="per-GPU bandwidth inside a node, GB/s per direction")
    plan.add_argument("--inter-node-gbps", type=float, default=None,
                      help="per-GPU bandwidth across nodes, GB/s per direction")
    plan.add_argument("--seq-len", type=int, default=None,
                      help="tokens per sample (default: the train loader's seq_len)")
    plan.add_argument("--ranks", default=None,
                      help="comma-separated ranks to simulate (default: the first and last)")
    plan.add_argument("--no-remedies", action="store_true",
                      help="do not look for a layout that fits")
    plan.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    plan.add_argument("--list-gpus", action="store_true", help="print the device table")
    plan.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    # cadence.planning imports torch only when a plan runs; it never initialises CUDA
    from cadence.config.load import ConfigError

    if args.list_gpus:
        from cadence.planning.report import format_devices

        print(format_devices())
        return 0
    if args.config is None or args.world_size is None:
        print("cadence plan: give RUN.yaml and --world-size N (or --list-gpus).",
              file=sys.stderr)
        return EXIT_CONFIG_ERROR
    from cadence.planning.devices import get_device
    from cadence.planning.planner import plan_run

    try:
        device = get_device(args.gpu, peak_tflops=args.peak_tflops,
                            memory_gib=args.memory_gib, intra_node_gbps=args.intra_node_gbps,
                            inter_node_gbps=args.inter_node_gbps)
        ranks = ([int(r) for r in args.ranks.split(",") if r.strip()]
                 if args.ranks else None)
        import contextlib

        # the plan's own prints (fsdp/tp verbose) go to stderr under --json
        with (contextlib.redirect_stdout(sys.stderr) if args.json
              else contextlib.nullcontext()):
            result = plan_run(args.config, args.overrides, world_size=args.world_size,
                              nnodes=args.nnodes, device=device, ranks=ranks,
                              seq_len=args.seq_len, remedies=not args.no_remedies)
    except (ConfigError, ValueError) as exc:
        print(f"cadence plan: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    if args.json:
        import json

        print(json.dumps(result.to_dict(), indent=1))
    else:
        from cadence.planning.report import format_plan

        print(format_plan(result))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from cadence.plot import plot_runs

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    try:
        out = plot_runs(args.runs, metrics=metrics, output=args.output, width=args.width,
                        panel_height=args.panel_height)
    except (ValueError, ImportError) as exc:
        print(f"cadence plot: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(f"wrote {out}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from cadence.checkpoint.checkpoint import CheckpointError
    from cadence.checkpoint.export import to_full
    from cadence.models.hf_export import to_huggingface
    from cadence.checkpoint.remote import fetched, uploaded

    try:  # either may be a URL (s3://...): downloaded / written locally, then uploaded
        with fetched(args.checkpoint) as checkpoint, uploaded(args.out) as target:
            if args.merge and args.to != "hf":
                raise ValueError("--merge goes with --to hf (a merged Hugging Face model).")
            if args.to == "hf":
                to_huggingface(checkpoint, target, merge=args.merge)
            else:
                to_full(checkpoint, target)
        out = args.out
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"cadence convert: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    # Imported when a run starts, not when the parser is built; the Trainer's modules only
    # once the run file's schema has passed (a typo is reported before torch is imported).
    from cadence.config.load import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"cadence train: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    from cadence.config.build import build_trainer
    from cadence.checkpoint.lock import SaveFolderInUse

    # before the Trainer is built: its start ("Resumed from checkpoint ...", a checkpoint
    # rejected or set aside, a pointer ignored) is logged while it is built
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        trainer = build_trainer(cfg)
    except ConfigError as exc:
        print(f"cadence train: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except SaveFolderInUse as exc:  # another live run holds the save folder: not a bad config
        print(f"cadence train: {exc}", file=sys.stderr)
        return 1
    from cadence.trainer.preemption import Preempted

    state = trainer.state  # max_duration is set: the run file requires it
    if state.reached(state.max_duration):
        # a relaunched job whose run already finished (autoresume): nothing left to train;
        # succeed, as a job restarted by its scheduler should (fit() itself would raise
        # Composer's "No training would occur")
        print(f"cadence train: run {state.run_name!r} already reached max_duration "
              f"{state.max_duration}; nothing to train.", file=sys.stderr)
        trainer.close()
        return 0
    try:
        trainer.fit()
    except Preempted as exc:  # checkpointed and closed: exit as the signal would (143 ...)
        print(f"cadence train: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        from cadence.launch.rank_health import report_collective_failure

        report_collective_failure(exc, cfg.dist_timeout)  # names the ranks that went silent
        raise
    finally:
        trainer.close()
    return 0


def _train_recorded(args: argparse.Namespace) -> int:
    """``_train`` under torchrun's ``@record`` when torchrun started this process: a failing
    rank writes its traceback to the error file torchrun reads, so the launcher shows it."""
    import os

    if "TORCHELASTIC_ERROR_FILE" not in os.environ:
        return _train(args)
    from torch.distributed.elastic.multiprocessing.errors import record

    from cadence.launch.rank_health import die_with_launcher

    die_with_launcher()  # torchrun starts ranks in their own session: tie them to it
    from cadence.launch.restarts import announce_restart

    announce_restart()  # rank 0 of a restarted group (cadence launch --max_restarts N)

    return int(record(_train)(args))


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


def exit_now(status: int) -> NoReturn:
    """End the ``cadence`` process with ``status``, without finalizing the interpreter when a
    process group exists (the entry point of ``cadence`` and ``python -m cadence``).

    As at a normal exit, non-daemon threads are joined and the ``atexit`` handlers run (they
    destroy the process groups, flush the logging handlers and whatever a library
    registered); then stdout and stderr are flushed, then ``os._exit(status)``. Finalizing
    instead could abort the process with SIGABRT after a run that succeeded: gloo threads
    still releasing the last collective's tensors cannot take the GIL once finalization has
    begun (see
    :func:`cadence.utils.dist.destroy_process_group_at_exit`), and the run's ``DeviceMesh``
    keeps its group alive until then. Everything ``cadence train`` writes is closed by
    ``Trainer.close()`` before this point. Without a process group, a plain ``SystemExit``.

    Raises:
        SystemExit: with ``status``, when no process group was created.
    """
    c10d = sys.modules.get("torch.distributed")
    if c10d is None or not (c10d.is_available() and c10d.is_initialized()):
        raise SystemExit(status)
    import threading

    for thread in threading.enumerate():  # as Python's own exit does: non-daemon threads end
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing left to save
            pass
    os._exit(status)


def run() -> NoReturn:
    """The ``cadence`` console script: :func:`main`, then :func:`exit_now`."""
    exit_now(main())
