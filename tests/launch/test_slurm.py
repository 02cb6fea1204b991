"""SLURM's environment, read without a cluster: host-list expansion, this node's place in
the job, and the torchrun command line ``cadence launch`` builds from it (no process is
started here; tests/launch/test_multinode.py runs a faked SLURM job for real)."""

from __future__ import annotations

import os
from typing import Optional

import pytest

from cadence.cli import build_parser, torchrun_argv
from cadence.launch.slurm import (
    DEFAULT_MASTER_PORT,
    SlurmNodes,
    default_master_port,
    expand_hostlist,
    slurm_nodes,
)

JOB = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "4", "SLURM_NODEID": "2",
       "SLURM_JOB_NODELIST": "gpu[007-009],login1", "SLURM_STEP_NUM_TASKS": "4"}


@pytest.mark.parametrize(("hostlist", "hosts"), [
    ("localhost", ["localhost"]),
    ("127.0.0.1", ["127.0.0.1"]),
    ("node[01-04,07],gpu5", ["node01", "node02", "node03", "node04", "node07", "gpu5"]),
    ("n[8-10]", ["n8", "n9", "n10"]),  # no padding: the width of the low end
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("r[1-2]-n[3,5]", ["r1-n3", "r1-n5", "r2-n3", "r2-n5"]),  # first bracket slowest
    ("a1, b[2]", ["a1", "b2"]),
    ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
])
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(("hostlist", "quoted"), [
    ("", "''"), ("node[1-3", "'node[1-3'"), ("node[3-1]", "'3-1'"), ("node[]", "''"),
    ("node[a-b]", "'a-b'"), ("n[[1]]", "'n[[1]]'"), ("a,,b", "''"), ("n1]", "'n1]'"),
])
def test_expand_hostlist_refuses_malformed_lists_quoting_the_bad_part(hostlist: str,
                                                                      quoted: str) -> None:
    with pytest.raises(ValueError, match="bad SLURM host list") as info:
        expand_hostlist(hostlist)
    assert quoted in str(info.value)


def test_default_master_port_is_derived_from_the_job_id() -> None:
    assert default_master_port("4242") == 19242
    assert default_master_port("1234567") == 19567
    assert default_master_port("1234567") != default_master_port("1234568")
    assert default_master_port(None) == DEFAULT_MASTER_PORT == 29500
    with pytest.raises(ValueError, match="SLURM_JOB_ID='12_3'.*--master_port"):
        default_master_port("12_3")


def test_slurm_nodes_reads_the_job() -> None:
    assert slurm_nodes(JOB) == SlurmNodes(nnodes=4, node_rank=2, master_addr="gpu007",
                                          master_port=19242, job_id="4242")


def test_slurm_nodes_falls_back_to_the_older_variable_names() -> None:
    env = {"SLURM_JOBID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
           "SLURM_NODELIST": "b[1-2]"}
    assert slurm_nodes(env) == SlurmNodes(2, 1, "b1", 15007, "7")


def test_the_step_wins_over_the_allocation() -> None:
    env = {**JOB, "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_NODELIST": "gpu[008-010]",
           "SLURM_STEP_NUM_TASKS": "3"}
    assert slurm_nodes(env) == SlurmNodes(3, 2, "gpu008", 19242, "4242")


@pytest.mark.parametrize("missing", ["SLURM_NODEID", "SLURM_NNODES", "SLURM_JOB_NODELIST"])
def test_outside_a_slurm_task_there_is_nothing_to_read(missing: str) -> None:
    assert slurm_nodes({k: v for k, v in JOB.items() if k != missing}) is None
    assert slurm_nodes({}) is None


@pytest.mark.parametrize(("change", "message"), [
    ({"SLURM_NODEID": "4"}, r"SLURM_NODEID=4 is outside \[0, SLURM_NNODES=4\)"),
    ({"SLURM_NNODES": "four"}, "SLURM_NNODES='four' is not a whole number"),
    ({"SLURM_STEP_NUM_TASKS": "32"},
     "SLURM_STEP_NUM_TASKS=32 tasks on SLURM_NNODES=4 nodes.*srun --ntasks-per-node=1"),
    ({"SLURM_JOB_NODELIST": "gpu[7-"}, "bad SLURM host list 'gpu\\[7-'"),
])
def test_slurm_nodes_refuses_what_it_cannot_use(change: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        slurm_nodes({**JOB, **change})


def argv(*cli: str, env: Optional[dict[str, str]] = None) -> list[str]:
    """``torchrun_argv`` for ``cadence launch CLI... run.yaml lr=1``, up to ``-m``."""
    args = build_parser().parse_args(["launch", *cli, "run.yaml", "lr=1"])
    full = torchrun_argv(args, env or {})
    assert full[full.index("-m"):] == ["-m", "cadence", "train", "run.yaml", "lr=1"]
    return [a for a in full[:full.index("-m")] if not a.startswith(("--max_restarts",
                                                                   "--monitor_interval"))]


def test_launch_under_slurm_takes_nodes_rank_address_and_port_from_the_job() -> None:
    assert argv("-n", "8", env=JOB) == [
        "--nproc_per_node=8", "--nnodes=4", "--node_rank=2", "--master_addr=gpu007",
        "--master_port=19242"]


def test_flags_given_win_over_slurm() -> None:
    assert argv("-n", "8", "--node_rank", "0", "--master_addr", "head", "--master_port", "1234",
                env=JOB) == ["--nproc_per_node=8", "--nnodes=4", "--node_rank=0",
                             "--master_addr=head", "--master_port=1234"]


def test_a_one_node_slurm_job_stays_on_localhost_with_a_free_port() -> None:
    got = argv("-n", "2", env={**JOB, "SLURM_NNODES": "1", "SLURM_NODEID": "0",
                               "SLURM_STEP_NUM_TASKS": "1"})
    assert got[:4] == ["--nproc_per_node=2", "--nnodes=1", "--node_rank=0",
                       "--master_addr=127.0.0.1"]
    assert got[4].startswith("--master_port=") and got[4] != "--master_port=19242"


def test_c10d_under_slurm_meets_at_the_first_host_with_the_job_id() -> None:
    assert argv("-n", "8", "--rdzv_backend", "c10d", env=JOB) == [
        "--nproc_per_node=8", "--nnodes=4", "--rdzv_backend=c10d",
        "--rdzv_endpoint=gpu007:19242", "--rdzv_id=4242"]


def test_c10d_flags_pass_through_as_torchrun_names_them() -> None:
    assert argv("-n", "1", "--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint",
                "h:29400", "--rdzv_id", "job7", "--rdzv_conf", "join_timeout=60") == [
        "--nproc_per_node=1", "--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=h:29400",
        "--rdzv_id=job7", "--rdzv_conf", "join_timeout=60"]


@pytest.mark.parametrize(("cli", "message"), [
    (["--nnodes", "2"], "--master_port is required with --nnodes > 1 outside SLURM"),
    (["--nnodes", "2", "--node_rank", "2", "--master_port", "1"],
     r"0 <= --node_rank < --nnodes \(got --node_rank 2, --nnodes 2\)"),
    (["--nnodes", "2", "--rdzv_backend", "c10d"], "--rdzv_endpoint HOST:PORT is required"),
    (["--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "h:1", "--node_rank", "1"],
     "--node_rank and --master_addr are for the static rendezvous"),
    (["--rdzv_endpoint", "h:1"], "--rdzv_endpoint and --rdzv_id are for --rdzv_backend c10d"),
    (["--nnodes", "0"], r"--nnodes >= 1 \(got -n 1, --nnodes 0\)"),
])
def test_launch_refuses_options_that_cannot_meet(cli: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        argv("-n", "1", *cli)


def test_cadence_launch_exits_2_naming_the_missing_option(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from cadence.cli import main

    for name in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    assert main(["launch", "-n", "1", "--nnodes", "2", "run.yaml"]) == 2
    assert "cadence launch: --master_port is required" in capsys.readouterr().err
