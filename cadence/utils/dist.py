"""Distributed helpers with single-process defaults (re-exported as ``cadence.dist``).

Ranks are read from ``torch.distributed`` when a process group exists, else from the
environment variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``...), so
they work before the process group is created. Collectives are no-ops in a single process;
with ``WORLD_SIZE > 1`` and no process group they raise an error that says how to launch.

Names follow Composer's ``composer.utils.dist``; the collectives wrap ``torch.distributed``.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import logging
import os
import random
import string
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch
import torch.distributed as torch_dist

__all__ = [
    "get_global_rank", "get_world_size", "get_local_rank", "get_local_world_size",
    "get_node_rank", "is_available", "is_initialized", "initialize_dist", "get_dist_timeout",
    "destroy_process_group_at_exit", "release_process_groups",
    "barrier",
    "all_reduce", "broadcast", "broadcast_object_list", "all_gather", "all_gather_object",
    "get_sampler", "run_local_rank_zero_first", "local_rank_zero_download_and_wait",
    "get_node_signal_file_name", "write_signal_file", "busy_wait_for_local_rank_zero",
    "rank_zero_only", "get_rank_zero_logger",
]

T = TypeVar("T")

_LAUNCH_HINT = (
    "Launch every rank with torchrun (`torchrun --nproc_per_node N -m cadence train RUN.yaml` "
    "or `cadence launch -n N RUN.yaml`), which sets RANK, WORLD_SIZE, MASTER_ADDR and "
    "MASTER_PORT; the Trainer then calls cadence.dist.initialize_dist()."
)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"Environment variable {name}={value!r} must be an integer.") from None


def is_available() -> bool:
    """Whether ``torch.distributed`` is built in."""
    return torch_dist.is_available()


def is_initialized() -> bool:
    """Whether a default process group exists."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_global_rank(group: Any = None) -> int:
    """This process's rank among all processes (0 without a process group or ``RANK``), or
    within ``group`` (a ``torch.distributed`` ProcessGroup) when one is given."""
    if is_initialized():
        return torch_dist.get_rank(group)
    return _env_int("RANK", 0)


def get_world_size() -> int:
    """The number of processes (1 without a process group or ``WORLD_SIZE``)."""
    if is_initialized():
        return torch_dist.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def get_local_rank() -> int:
    """This process's rank on its node (``LOCAL_RANK``, default 0)."""
    return _env_int("LOCAL_RANK", 0)


def get_local_world_size() -> int:
    """The number of processes on this node (``LOCAL_WORLD_SIZE``, default 1)."""
    return _env_int("LOCAL_WORLD_SIZE", 1)


def get_node_rank() -> int:
    """This node's rank (``NODE_RANK``, else ``GROUP_RANK``, default 0)."""
    return _env_int("NODE_RANK", _env_int("GROUP_RANK", 0))


_dist_timeout_s = 600.0  # the run's dist_timeout, recorded by initialize_dist


def _device_type(device: Any) -> str:
    """``"cuda"`` or ``"cpu"`` (...) for ``initialize_dist``'s ``device``: a name (Composer's
    ``"gpu"`` included), a ``torch.device``, a :class:`cadence.devices.Device` (its
    ``torch_device``), or None (CUDA when available)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    torch_device = getattr(device, "torch_device", None)
    if isinstance(torch_device, torch.device):
        return torch_device.type
    if isinstance(device, str) and device.lower() == "gpu":
        return "cuda"
    return torch.device(device).type


def initialize_dist(device: Any = "cpu", timeout: float = 600.0) -> None:
    """Create the default process group from torchrun's environment, if there is more than one
    process and no group yet. Backend: ``nccl`` for CUDA, ``gloo`` for CPU.

    Args:
        device: the device the run uses; picks the backend: ``"cpu"`` (default), ``"gpu"``
            or ``"cuda"``, a ``torch.device``, a :class:`cadence.devices.Device` (what
            llm-foundry passes: ``get_device(None)``), or None (CUDA when available).
        timeout: seconds a collective (and the group's creation) may wait for the other
            ranks before it fails (default 600, Composer's ``dist_timeout``). A rank that
            stops answering thus ends the job after ``timeout`` seconds instead of hanging it.
            Recorded for the process groups cadence creates beside the default one
            (:func:`get_dist_timeout`), also when the default group already exists.

    Raises:
        ValueError: ``timeout`` is not a positive number of seconds.
        RuntimeError: ``WORLD_SIZE > 1`` but ``MASTER_ADDR``/``MASTER_PORT`` are missing.
        TypeError, RuntimeError: ``device`` is none of the above (from ``torch.device``).
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"dist_timeout must be a positive number of seconds, got {timeout!r} "
                         f"(default 600).")
    global _dist_timeout_s
    _dist_timeout_s = float(timeout)
    if is_initialized() or _env_int("WORLD_SIZE", 1) <= 1:
        return
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT", "RANK") if name not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE > 1 but {', '.join(missing)} not set. {_LAUNCH_HINT}")
    device_type = _device_type(device)
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(get_local_rank())
    torch_dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout),
                                  **_restart_store(timeout))
    destroy_process_group_at_exit()


def _restart_store(timeout: float) -> dict[str, Any]:
    """The store of a group torchrun restarted (``TORCHELASTIC_RESTART_COUNT > 0``) on the
    agent's store: its keys under ``attempt_<n>/``, since that store outlives the attempts
    and the dead attempt's keys (gloo's addresses, NCCL's unique id) would be read back and
    fail the new group (``Gloo connectFullMesh failed ... Connection refused``). Else ``{}``
    (``init_process_group``'s own ``env://``)."""
    attempt = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
    if attempt <= 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    client = torch_dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                 is_master=False,
                                 timeout=datetime.timedelta(seconds=timeout))
    return {"store": torch_dist.PrefixStore(f"attempt_{attempt}", client),
            "rank": _env_int("RANK", 0), "world_size": _env_int("WORLD_SIZE", 1)}


_exit_hook_registered = False
_owns_default_group = False  # cadence created the default group (not the user)

#: The longest :func:`release_process_groups` waits for the backends' threads to go idle.
SETTLE_TIMEOUT_S = 2.0


def destroy_process_group_at_exit() -> None:
    """Destroy every process group when the interpreter exits normally (an ``atexit`` hook,
    registered once; cadence calls it for every group it creates, which marks the group as
    cadence's own for :func:`release_process_groups`).

    Gloo's worker threads may still be releasing the last collective's tensors when Python
    finalizes; such a thread can no longer take the GIL, and the process aborts
    (``terminate called without an active exception``, SIGABRT) after a run that succeeded,
    failing its launch (an open PyTorch bug, pytorch/pytorch#190489). Destroying a group
    does not stop its threads while anything still holds it (the DDP wrapper, a
    ``DeviceMesh`` and FSDP2's state do), so the hook destroys every group, frees what is
    no longer referenced (a group nothing holds joins its threads), then lets the remaining
    threads finish (:func:`release_process_groups`), all before finalization: this covers a
    user's script, ``python -m`` and a notebook under torchrun as well as ``cadence``'s own
    entry point (which also ends without finalizing, :func:`cadence.cli.exit_now`).
    After an uncaught exception the hook does nothing: a collective still waiting on a dead
    or hung peer would hold the exit for up to ``dist_timeout``.
    """
    global _exit_hook_registered, _owns_default_group
    if torch_dist.is_available() and torch_dist.is_initialized():
        _owns_default_group = True
    if not _exit_hook_registered:
        atexit.register(_destroy_at_exit)
        _exit_hook_registered = True


def release_process_groups(*, only_own: bool = True, collect: bool = False) -> bool:
    """End the run's distributed state before the interpreter finalizes: destroy the default
    process group and every group made from it (a ``DeviceMesh``'s included), then wait (at
    most :data:`SETTLE_TIMEOUT_S`) until the process's native threads (gloo's workers) have
    gone idle, with the GIL released so that a worker still releasing the last collective's
    tensors can finish (see :func:`destroy_process_group_at_exit`).

    ``Trainer.close()`` calls it: a closed Trainer runs no more collectives (``fit()`` twice
    and ``eval()`` after ``fit()`` happen before ``close()``); a later Trainer in the same
    process creates the group again. The ``atexit`` hook calls it too, for a script that
    never closes its Trainer.

    Args:
        only_own: leave the groups alone unless cadence created the default group (a
            group the user created stays theirs), and leave a one-rank group (a single
            process's FSDP2 or tensor-parallel run, which may still read its ``DTensor``
            weights) to the exit hook.
        collect: run the garbage collector after destroying, so that groups nothing
            references any more are freed (their threads joined); the exit hook does.

    Returns:
        Whether groups were destroyed.
    """
    global _owns_default_group
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return False
    if only_own and not (_owns_default_group and torch_dist.get_world_size() > 1):
        return False
    torch_dist.destroy_process_group()  # None: every group, the default one last
    _owns_default_group = False
    if collect:
        import gc

        gc.collect()
    _wait_for_native_threads_to_settle(SETTLE_TIMEOUT_S)
    return True


def _native_thread_states() -> Optional[dict[int, str]]:
    """The scheduler state (``R``, ``S``, ...) of each thread of this process that Python's
    :mod:`threading` did not start (gloo's workers among them); ``None`` where ``/proc``
    cannot tell (not Linux)."""
    import threading

    python_threads = {t.native_id for t in threading.enumerate()} | {threading.get_native_id()}
    states: dict[int, str] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        if not tid.isdigit() or int(tid) in python_threads:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        states[int(tid)] = stat.rpartition(")")[2].split()[0]
    return states


def _wait_for_native_threads_to_settle(timeout_s: float, quiet_polls: int = 3,
                                       poll_s: float = 0.01) -> None:
    """Sleep (the GIL released) until no native thread is running for ``quiet_polls``
    polls in a row, or ``timeout_s`` passed: a gloo worker that finished the last collective
    but still holds its tensors takes the GIL meanwhile and goes back to waiting."""
    import time

    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < quiet_polls and time.monotonic() < deadline:
        time.sleep(poll_s)
        states = _native_thread_states()
        if states is None:  # cannot tell: a fixed pause instead
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            return
        quiet = quiet + 1 if all(state != "R" for state in states.values()) else 0


def _destroy_at_exit() -> None:
    if getattr(sys, "last_value", None) is not None:  # an uncaught exception ends the process
        return
    release_process_groups(only_own=False, collect=True)


def get_dist_timeout() -> datetime.timedelta:
    """The run's ``dist_timeout`` (the last :func:`initialize_dist`'s ``timeout``; 600 s
    before any), for every process group cadence creates beside the default one (the
    asynchronous checkpoint's, the tensor-parallel metrics' ...): ``torch.distributed.new_group``
    would otherwise give them torch's default (30 minutes for gloo), not the run's."""
    return datetime.timedelta(seconds=_dist_timeout_s)


def _needs_group(name: str) -> bool:
    """True when a collective must run; raises if one is needed but cannot run."""
    if is_initialized():
        return torch_dist.get_world_size() > 1
    if _env_int("WORLD_SIZE", 1) > 1:
        raise RuntimeError(
            f"cadence.dist.{name}() was called with WORLD_SIZE={os.environ['WORLD_SIZE']} but no "
            f"process group exists. {_LAUNCH_HINT}"
        )
    return False


def barrier(group: Any = None) -> None:
    """Wait for every rank, or every rank of ``group`` (a no-op in one process)."""
    if _needs_group("barrier"):
        torch_dist.barrier(group=group)


_REDUCE_OPS = {"sum": "SUM", "product": "PRODUCT", "min": "MIN", "max": "MAX",
               "band": "BAND", "bor": "BOR", "bxor": "BXOR", "avg": "AVG"}


def all_reduce(tensor: torch.Tensor, reduce_operation: str = "sum", group: Any = None) -> None:
    """Reduce ``tensor`` in place over all ranks (or the ranks of ``group``).

    Args:
        tensor: any shape; the result lands in it on every rank.
        reduce_operation: ``sum`` (default), ``product``, ``min``, ``max``, ``avg`` (NCCL
            only), ``band``, ``bor``, ``bxor`` (case-insensitive).

    Raises:
        ValueError: unknown ``reduce_operation``.
    """
    op_name = _REDUCE_OPS.get(reduce_operation.lower())
    if op_name is None:
        raise ValueError(
            f"reduce_operation {reduce_operation!r} is not one of: {', '.join(_REDUCE_OPS)}."
        )
    if _needs_group("all_reduce"):
        torch_dist.all_reduce(tensor, op=getattr(torch_dist.ReduceOp, op_name), group=group)


def broadcast(tensor: torch.Tensor, src: int = 0, group: Any = None) -> None:
    """Copy ``tensor`` from global rank ``src`` into every rank's ``tensor`` (same shape,
    dtype), over all ranks or the ranks of ``group``."""
    if _needs_group("broadcast"):
        torch_dist.broadcast(tensor, src=src, group=group)


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Any = None) -> None:
    """Replace ``object_list``'s items on every rank (of ``group``) with global rank ``src``'s
    (pickled)."""
    if _needs_group("broadcast_object_list"):
        torch_dist.broadcast_object_list(object_list, src=src, group=group)


def all_gather(tensor: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on all ranks), in rank order; over the ranks of
    ``group`` when one is given."""
    if not _needs_group("all_gather"):
        return [tensor]
    gathered = [torch.empty_like(tensor) for _ in range(torch_dist.get_world_size(group))]
    torch_dist.all_gather(gathered, tensor, group=group)
    return gathered


def all_gather_object(obj: T, group: Any = None) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order; over ``group``'s ranks if given."""
    if not _needs_group("all_gather_object"):
        return [obj]
    gathered: list[Any] = [None] * torch_dist.get_world_size(group)
    torch_dist.all_gather_object(gathered, obj, group=group)
    return gathered


def get_sampler(
    dataset: torch.utils.data.Dataset, *, drop_last: bool = False, shuffle: bool = False,
    num_replicas: Optional[int] = None, rank: Optional[int] = None, seed: int = 0,
) -> torch.utils.data.DistributedSampler:
    """A ``DistributedSampler`` over ``dataset`` for this rank, so each rank sees distinct
    samples. Use it for every map-style dataset in a multi-rank run; call
    ``sampler.set_epoch(epoch)`` each epoch (the Trainer does this).

    Args:
        dataset: a map-style dataset.
        drop_last: drop the tail so every rank gets the same number of samples (else the
            tail is padded with repeated samples); default False, as in Composer.
        shuffle: shuffle (seeded by ``seed`` and the epoch); default False, as in Composer.
            Training loaders usually want ``shuffle=True``; pass it explicitly.
        seed: the shuffle seed, the same on every rank; default 0 (cadence's addition).
        num_replicas, rank: default the world size and this process's global rank.
    """
    return torch.utils.data.DistributedSampler(
        dataset, num_replicas=get_world_size() if num_replicas is None else num_replicas,
        rank=get_global_rank() if rank is None else rank, shuffle=shuffle, seed=seed,
        drop_last=drop_last,
    )


@contextmanager
def run_local_rank_zero_first() -> Iterator[None]:
    """Local rank 0 runs the block first; the other local ranks wait, then run it (e.g. so
    only one process per node builds a cache the others read)."""
    if not _needs_group("run_local_rank_zero_first"):
        yield
        return
    if get_local_rank() != 0:
        torch_dist.barrier()
    try:
        yield
    finally:
        if get_local_rank() == 0:
            torch_dist.barrier()


@contextmanager
def local_rank_zero_download_and_wait(expected_file_path: str) -> Iterator[None]:
    """A block that local rank 0 runs to make ``expected_file_path`` (e.g. download it);
    Composer's context manager. The other local ranks first wait, polling every 0.1 s,
    until the file exists, then run the block too (typically skipping the download). It
    needs no process group, only ``LOCAL_RANK``; it never times out.

    ::

        with dist.local_rank_zero_download_and_wait(path):
            if dist.get_local_rank() == 0:
                get_file(uri, path)
    """
    if get_local_rank() != 0:
        while not os.path.exists(expected_file_path):
            time.sleep(0.1)
    yield


def get_node_signal_file_name(rng: Optional[random.Random] = None) -> str:
    """A file name for one wait among a node's ranks (Composer's helper):
    ``._signal_file_node{node_rank}_{6 random letters or digits}``, the random part drawn
    from ``rng`` (default: a fresh ``random.Random()``) on global rank 0 and broadcast, so
    every rank of a node gets the same name and two waits do not share a file. Call it on
    every rank (a collective with several ranks)."""
    rng = rng or random.Random()
    token = ["".join(rng.choices(string.ascii_letters + string.digits, k=6))]
    broadcast_object_list(token, src=0)
    return f"._signal_file_node{get_node_rank()}_{token[0]}"


def write_signal_file(signal_file_name: str, dir_path: Optional[str] = None) -> str:
    """Write the (empty-content) signal file ``signal_file_name`` in ``dir_path`` (default:
    the working directory); returns its path (Composer's helper)."""
    path = signal_file_name if dir_path is None else os.path.join(dir_path, signal_file_name)
    with open(path, "w") as f:
        f.write("local rank zero done")
    return path


@contextmanager
def busy_wait_for_local_rank_zero(dir_path: Optional[str] = None,
                                  poll_seconds: float = 0.1) -> Iterator[None]:
    """Run the block on every rank, then hold each other rank of the node until local rank 0
    has left it too (Composer's helper), by polling for a signal file local rank 0 writes in
    ``dir_path`` (a folder every rank of the node sees; default: the working directory)
    rather than a collective, so waiting ranks do not time out in a long barrier. The file
    is removed once every rank has seen it. One process: just runs the block.

    Raises:
        RuntimeError: the signal file has not appeared after :func:`get_dist_timeout`.
    """
    name = get_node_signal_file_name()
    yield
    path = name if dir_path is None else os.path.join(dir_path, name)
    if get_local_rank() == 0:
        write_signal_file(name, dir_path)
    else:
        deadline = time.monotonic() + get_dist_timeout().total_seconds()
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Local rank 0 did not write {path} within the dist timeout; "
                                   f"is {dir_path or os.getcwd()!r} shared by the node's ranks?")
            time.sleep(poll_seconds)
    barrier()
    if get_local_rank() == 0:
        os.remove(path)


def rank_zero_only(fn: Callable[..., T]) -> Callable[..., Optional[T]]:
    """Decorate ``fn`` to run on global rank 0 only (others return ``None``). The rank comes
    from the environment, so it works before the process group exists."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Optional[T]:
        if get_global_rank() == 0:
            return fn(*args, **kwargs)
        return None

    return wrapped


class _RankZeroFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return get_global_rank() == 0


def get_rank_zero_logger(name: str) -> logging.Logger:
    """A :mod:`logging` logger whose records are emitted on global rank 0 only."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, _RankZeroFilter) for f in logger.filters):
        logger.addFilter(_RankZeroFilter())
    return logger

