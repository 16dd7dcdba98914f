"""NCCL's own account of its transport (NCCL_DEBUG=INFO lines), parsed and judged: the real lines an
H200 printed (2026-12-04) and lines composed from NCCL's sources, kept in tests/support/nccl_logs/
with where each came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.fabric_check import REPORT
from components.nccl import ENFORCE, NcclDevice, nccl_verdict, parse_nccl_log

LOGS = Path(__file__).resolve().parents[1] / "support" / "nccl_logs"


def log(name: str) -> str:
    return (LOGS / name).read_text()


def test_the_h200_fallback_to_sockets():
    nccl = parse_nccl_log(log("h200_socket_fallback.log"))
    assert nccl.network == "Socket"
    assert nccl.ib_failed and not nccl.ib_disabled
    assert nccl.ib_devices == () and nccl.oob == "lo:127.0.0.1"
    assert nccl.socket_ifs == (("lo", "127.0.0.1"),)
    assert nccl.env == {"NCCL_IB_HCA": "rocep1s0f1:1,roceP2p1s0f1:1"}
    assert nccl.gid_index == {}
    # The lines that decided it, as NCCL printed them; `Initialized`/`Assigned` are not among them.
    assert nccl.lines == (
        "NCCL INFO NCCL_IB_HCA set to rocep1s0f1:1,roceP2p1s0f1:1",
        "NCCL INFO NET/IB : No device found.",
        "NCCL INFO NET/IB : Using [RO]; OOB lo:127.0.0.1<0>",
        "NCCL INFO Failed to initialize NET plugin IB",
        "NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>",
        "NCCL INFO Using network Socket",
    )


def test_the_h200_with_ib_disabled():
    nccl = parse_nccl_log(log("h200_ib_disabled.log"))
    assert nccl.network == "Socket" and nccl.ib_disabled and not nccl.ib_failed
    # param.cc prints a number followed by a period: the period is not the value.
    assert nccl.env == {"NCCL_IB_DISABLE": "1"}


def test_the_prefix_is_tolerated_and_other_lines_ignored():
    bare = log("h200_socket_fallback.log")
    prefixed = "\n".join(
        f"spark-2:31337:31402 [0] {line}" if line.startswith("NCCL") else line for line in bare.splitlines()
    )
    assert parse_nccl_log(prefixed) == parse_nccl_log(bare)
    assert parse_nccl_log("Traceback (most recent call last):\nNCCL version 2.28.9+cuda13.0\n") == (
        parse_nccl_log("")
    )
    assert parse_nccl_log("").network is None


def test_a_spark_over_roce_from_the_v2_28_9_sources():
    nccl = parse_nccl_log(log("spark_roce_v2.28.9.log"))
    assert nccl.network == "IB" and not nccl.ib_failed and not nccl.ib_disabled
    assert nccl.ib_devices == (
        NcclDevice(0, "roceP2p1s0f0", 1, "RoCE"),
        NcclDevice(1, "rocep1s0f0", 1, "RoCE"),
    )
    assert nccl.ib_hcas == ("roceP2p1s0f0:1", "rocep1s0f0:1")
    assert nccl.oob == "enp1s0f0np0:192.168.200.12"
    # IbDev N is the N-th device of the `NET/IB : Using` list; mtu 5 is verbs' IBV_MTU_4096.
    assert nccl.gid_index == {"roceP2p1s0f0:1": 3, "rocep1s0f0:1": 3}
    assert nccl.active_mtu == {"roceP2p1s0f0:1": 4096, "rocep1s0f0:1": 4096}
    assert nccl.env == {
        "NCCL_SOCKET_IFNAME": "enp1s0f0np0",
        "NCCL_IB_HCA": "roceP2p1s0f0:1,rocep1s0f0:1",
        "NCCL_IB_GID_INDEX": "3",
    }
    assert not any("Bootstrap" in line or "torch" in line for line in nccl.lines)


def test_the_later_format_with_rails_and_a_gid_per_device():
    nccl = parse_nccl_log(log("roce_master_2026-06.log"))
    # Without relaxed ordering the list ends with a space before `;`; a rail follows a port.
    assert nccl.ib_hcas == ("mlx5_0:1", "mlx5_1:1") and nccl.oob == "eth0:10.0.0.1"
    assert nccl.gid_index == {"mlx5_1:1": 5, "mlx5_0:1": 3}
    assert nccl.active_mtu == {"mlx5_1:1": 2048, "mlx5_0:1": 4096}


def test_a_gid_line_without_the_device_list_names_the_index():
    nccl = parse_nccl_log(
        "h:1:2 [0] NCCL INFO NET/IB: NCCL Dev 0 IbDev 2 Port 1 qpn 9 mtu 3 GID 4 (0/0) fifoRkey=0x1 "
        "fifoLkey=0x1"
    )
    assert nccl.gid_index == {"IbDev 2:1": 4} and nccl.active_mtu == {"IbDev 2:1": 1024}


def test_a_spark_container_without_its_devices_from_the_sources():
    nccl = parse_nccl_log(log("spark_socket_fallback_v2.28.9.log"))
    assert nccl.network == "Socket" and nccl.ib_failed
    assert nccl.socket_ifs == (("enp1s0f1np1", "192.168.200.13"),)


# ---- the verdict ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["h200_socket_fallback.log", "spark_socket_fallback_v2.28.9.log", "h200_ib_disabled.log"]
)
def test_sockets_while_hcas_are_configured_are_refused_under_enforce_naming_node_and_lines(name):
    nccl = parse_nccl_log(log(name))
    verdict = nccl_verdict("spark-2", ENFORCE, nccl, ["rocep1s0f1:1", "roceP2p1s0f1:1"])
    assert verdict.verdict == "fail" and verdict.network == "Socket"
    (problem,) = verdict.problems
    assert problem.startswith("spark-2: NCCL used network Socket, not IB, although NCCL_IB_HCA is ")
    assert "`NCCL INFO Using network Socket`" in problem and "`NCCL INFO NET/Socket : Using [0]" in problem
    assert verdict.refusal.startswith("NCCL check on spark-2:") and problem in verdict.refusal
    if nccl.ib_disabled:
        assert "`NCCL INFO NCCL_IB_DISABLE set by environment to 1.`" in problem
        assert "NCCL_IB_DISABLE is set in the container's environment" in problem
    else:
        assert "`NCCL INFO NET/IB : No device found.`" in problem
        assert "/dev/infiniband" in problem and "libibverbs" in problem


def test_report_records_the_problem_and_goes_on():
    nccl = parse_nccl_log(log("h200_socket_fallback.log"))
    verdict = nccl_verdict("spark-2", REPORT, nccl, ["rocep1s0f1:1"])
    assert verdict.problems and verdict.refusal is None


def test_the_hcas_the_log_says_nccl_read_are_the_default():
    # No HCA list given: NCCL_IB_HCA as NCCL read it (the H200 run was given two).
    verdict = nccl_verdict("gpu-1", ENFORCE, parse_nccl_log(log("h200_socket_fallback.log")))
    assert verdict.refusal and "NCCL_IB_HCA is rocep1s0f1:1,roceP2p1s0f1:1" in verdict.problems[0]


def test_sockets_without_hcas_is_what_was_asked():
    # The lab (no RDMA): NCCL_IB_DISABLE=1 and no NCCL_IB_HCA; sockets are the expected transport.
    verdict = nccl_verdict("node-b", ENFORCE, parse_nccl_log(log("h200_ib_disabled.log")), [])
    assert verdict.verdict == "pass" and verdict.refusal is None and verdict.warnings == ()


def test_ib_over_every_given_hca_passes():
    nccl = parse_nccl_log(log("spark_roce_v2.28.9.log"))
    verdict = nccl_verdict("spark-1", ENFORCE, nccl, ["roceP2p1s0f0:1", "rocep1s0f0:1"])
    assert (verdict.verdict, verdict.problems, verdict.warnings) == ("pass", (), ())
    # A pin by device name matches its port.
    assert nccl_verdict("spark-1", ENFORCE, nccl, ["rocep1s0f0", "roceP2p1s0f0"]).warnings == ()


def test_ib_over_fewer_hcas_than_given_warns():
    nccl = parse_nccl_log(log("spark_roce_v2.28.9.log"))
    verdict = nccl_verdict("spark-1", ENFORCE, nccl, ["rocep1s0f0:1", "roceP2p1s0f0:1", "rocep1s0f1:1"])
    assert verdict.verdict == "pass" and verdict.refusal is None
    (warning,) = verdict.warnings
    assert warning.startswith("spark-1: NCCL took roceP2p1s0f0:1, rocep1s0f0:1 but was given")
    assert "rocep1s0f1:1 left out" in warning


def test_a_log_without_the_network_line_cannot_prove_rdma():
    verdict = nccl_verdict("spark-1", ENFORCE, parse_nccl_log("NCCL INFO NCCL_IB_HCA set to x:1"), ["x:1"])
    (problem,) = verdict.problems
    assert "names no network" in problem and "NCCL_DEBUG=INFO" in problem and verdict.refusal
