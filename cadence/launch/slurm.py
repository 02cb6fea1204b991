"""Where a node stands in a SLURM job, read from the ``SLURM_*`` environment.

``cadence launch`` runs once per node (``srun --ntasks-per-node=1 cadence launch -n 8
RUN.yaml``) and starts that node's ranks through torchrun. Under SLURM it takes what it was
not given from the job: the number of nodes, this node's rank and the rank-0 node's address
(the first host of the job's node list). Everything here is a pure function of the
environment mapping, so it is tested without a cluster; ``scontrol`` is never called.

Variables read (``srun`` sets them in every task; the first one present wins):

- node count: ``SLURM_STEP_NUM_NODES``, ``SLURM_NNODES``, ``SLURM_JOB_NUM_NODES``
- node rank: ``SLURM_NODEID``
- node list: ``SLURM_STEP_NODELIST``, ``SLURM_JOB_NODELIST``, ``SLURM_NODELIST``, in SLURM's
  compressed form (``node[01-04,07],gpu5``; see :func:`expand_hostlist`)
- job id: ``SLURM_JOB_ID``, ``SLURM_JOBID`` (for the default port and rendezvous id)
- task count of the step: ``SLURM_STEP_NUM_TASKS`` (checked: one task per node)

Source: SLURM's ``srun(1)`` "OUTPUT ENVIRONMENT VARIABLES" and ``hostlist`` syntax; the
default port follows PyTorch Lightning's ``SLURMEnvironment`` (15000 + the last four digits
of the job id), so two jobs that share a node do not collide.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = [
    "SLURM_PORT_BASE", "DEFAULT_MASTER_PORT", "SlurmNodes", "expand_hostlist",
    "default_master_port", "slurm_nodes",
]

#: The default rank-0 port under SLURM is ``SLURM_PORT_BASE + job_id % 10000``.
SLURM_PORT_BASE = 15000
#: The rank-0 port when the job id is unknown (torchrun's default).
DEFAULT_MASTER_PORT = 29500

_NODE_COUNT_VARS = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
_NODE_LIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_JOB_ID_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class SlurmNodes:
    """This node's place in a SLURM job step.

    Attributes:
        nnodes: nodes in the step (one ``cadence launch`` each).
        node_rank: this node's index, ``0 <= node_rank < nnodes`` (``SLURM_NODEID``).
        master_addr: host name of node 0: the first host of the node list.
        master_port: the rank-0 port, from :func:`default_master_port`.
        job_id: ``SLURM_JOB_ID``, or ``None`` when unset.
    """

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    job_id: Optional[str]


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand SLURM's compressed host list into host names, in SLURM's order.

    Items are separated by commas outside brackets; a bracket holds comma-separated numbers
    or ``lo-hi`` ranges, zero-padded to the width of ``lo``; several brackets in one item
    give every combination, the first bracket varying slowest.

    Examples:
        ``"node[01-03,07],gpu5"`` -> ``["node01", "node02", "node03", "node07", "gpu5"]``;
        ``"r[1-2]-n[8-10]"`` -> ``["r1-n8", "r1-n9", "r1-n10", "r2-n8", "r2-n9", "r2-n10"]``.

    Raises:
        ValueError: an empty list or item, an unclosed or nested bracket, or a bracket
            entry that is not ``N`` or ``LO-HI`` with ``LO <= HI``; the message quotes it.
    """
    hosts: list[str] = []
    for item in _split_outside_brackets(hostlist):
        pieces = re.split(r"(\[[^\[\]]*\])", item)
        if not item or any("[" in p or "]" in p for p in pieces if not p.startswith("[")):
            raise ValueError(f"bad SLURM host list {hostlist!r}: cannot read item {item!r} "
                             f"(expected names like node[01-04,07],gpu5).")
        choices = [_expand_bracket(p[1:-1], hostlist) if p.startswith("[") else [p]
                   for p in pieces]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def _split_outside_brackets(hostlist: str) -> list[str]:
    items: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(hostlist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(hostlist[start:i])
            start = i + 1
    items.append(hostlist[start:])
    return [item.strip() for item in items]


def _expand_bracket(body: str, hostlist: str) -> list[str]:
    names: list[str] = []
    for entry in body.split(","):
        match = _RANGE.match(entry.strip())
        if match is None or (match[2] is not None and int(match[1]) > int(match[2])):
            raise ValueError(f"bad SLURM host list {hostlist!r}: [{body}] holds {entry!r}, "
                             f"expected a number N or a range LO-HI with LO <= HI.")
        lo, hi = match[1], match[2] if match[2] is not None else match[1]
        names.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return names


def default_master_port(job_id: Optional[str]) -> int:
    """``SLURM_PORT_BASE + job_id % 10000`` (15000-24999), or 29500 without a job id.

    Every node of a job computes the same port; jobs with different ids among any 10000
    consecutive ones get different ports, so two jobs that share node 0 do not collide.

    Raises:
        ValueError: ``job_id`` is not a number (array jobs' ``SLURM_JOB_ID`` is numeric).
    """
    if job_id is None:
        return DEFAULT_MASTER_PORT
    if not job_id.strip().isdigit():
        raise ValueError(f"SLURM_JOB_ID={job_id!r} is not a number; pass --master_port.")
    return SLURM_PORT_BASE + int(job_id) % 10000


def slurm_nodes(environ: Mapping[str, str]) -> Optional[SlurmNodes]:
    """This node's place in the SLURM job step described by ``environ``.

    Args:
        environ: the environment, e.g. ``os.environ``.

    Returns:
        ``None`` outside a SLURM task (no ``SLURM_NODEID``, no node count or no node list,
        e.g. on a login node after ``salloc``), else the :class:`SlurmNodes`.

    Raises:
        ValueError: a variable that cannot be read (naming it and its value), a node rank
            outside ``[0, nnodes)``, or a step that runs more than one task per node
            (``SLURM_STEP_NUM_TASKS`` != the node count): ``cadence launch`` starts a
            node's ranks itself, so it must run once per node
            (``srun --ntasks-per-node=1``).
    """
    count_var = next((v for v in _NODE_COUNT_VARS if environ.get(v)), None)
    list_var = next((v for v in _NODE_LIST_VARS if environ.get(v)), None)
    if environ.get("SLURM_NODEID") is None or count_var is None or list_var is None:
        return None
    nnodes = _int_var(environ, count_var)
    node_rank = _int_var(environ, "SLURM_NODEID")
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"SLURM_NODEID={node_rank} is outside [0, {count_var}={nnodes}).")
    tasks = environ.get("SLURM_STEP_NUM_TASKS")
    if tasks is not None and _int_var(environ, "SLURM_STEP_NUM_TASKS") != nnodes:
        raise ValueError(
            f"SLURM started SLURM_STEP_NUM_TASKS={tasks} tasks on {count_var}={nnodes} nodes; "
            f"cadence launch starts each node's ranks itself, so run it once per node: "
            f"srun --ntasks-per-node=1 cadence launch -n GPUS_PER_NODE RUN.yaml")
    hosts = expand_hostlist(environ[list_var])
    job_id = next((environ[v] for v in _JOB_ID_VARS if environ.get(v)), None)
    return SlurmNodes(nnodes=nnodes, node_rank=node_rank, master_addr=hosts[0],
                      master_port=default_master_port(job_id), job_id=job_id)


def _int_var(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"{name}={environ[name]!r} is not a whole number.") from None
