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
    assert problem.startswith("spark-2: NCCL used network Socket, not RDMA, although NCCL_IB_HCA is ")
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


# ---- network plugins: only `Socket` is the fallback to TCP ------------------------------------------
# NGC images load HPC-X's RDMA plugin (`IBext`, `IBext_v6`, `IBext_v8`); others load `UCX` or
# `AWS Libfabric`. Each is judged by the HCAs its own `NET/IB : Using` line lists, not by its name.


def test_hpcx_rdma_plugin_is_parsed_with_its_hcas():
    nccl = parse_nccl_log(log("hpcx_ibext_plugin.log"))
    assert nccl.network == "IBext"
    # `Failed to find ncclNetPlugin_v8 symbol.` is NCCL probing the plugin's API, not a failure.
    assert not nccl.ib_failed and not nccl.ib_disabled
    assert nccl.ib_hcas == ("mlx5_0:1", "mlx5_1:1") and nccl.oob == "eth0:10.0.1.2"
    assert "NCCL INFO Using network IBext" in nccl.lines
    # One channel line per network is quoted, not one per channel.
    assert sum("via NET/" in line for line in nccl.lines) == 1


def test_hpcx_rdma_plugin_over_the_given_hcas_passes_under_enforce():
    nccl = parse_nccl_log(log("hpcx_ibext_plugin.log"))
    verdict = nccl_verdict("gpu-a", ENFORCE, nccl, ["mlx5_0:1", "mlx5_1:1"])
    assert (verdict.verdict, verdict.problems, verdict.warnings, verdict.refusal) == ("pass", (), (), None)
    # The HCAs NCCL read from its environment are the default, as for NCCL's own IB.
    assert nccl_verdict("gpu-a", ENFORCE, nccl).problems == ()


def test_a_plugin_that_took_fewer_hcas_than_given_warns_as_ib_does():
    nccl = parse_nccl_log(log("hpcx_ibext_plugin.log"))
    verdict = nccl_verdict("gpu-a", ENFORCE, nccl, ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1"])
    assert verdict.verdict == "pass" and verdict.refusal is None
    (warning,) = verdict.warnings
    assert "NCCL took mlx5_0:1, mlx5_1:1" in warning and "mlx5_2:1 left out" in warning


def test_ibext_v8_with_merged_devices_lists_each_port():
    nccl = parse_nccl_log(
        "h:1:2 [0] NCCL INFO P2P plugin IBext_v8\n"
        "h:1:2 [0] NCCL INFO NET/IB : Using [0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} "
        "[1]={[2] mlx5_0:1/RoCE, [3] mlx5_1:1/RoCE} [RO]; OOB bond0:10.1.1.9<0>\n"
        "h:1:2 [0] NCCL INFO Using network IBext_v8\n"
    )
    assert nccl.network == "IBext_v8"
    assert nccl.ib_hcas == ("mlx5_2:1", "mlx5_3:1", "mlx5_0:1", "mlx5_1:1")
    given = ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    assert nccl_verdict("h", ENFORCE, nccl, given).verdict == "pass"


def test_a_log_with_only_channel_lines_names_the_plugin():
    nccl = parse_nccl_log(
        "h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB/SHARP [1]mlx5_1:1/RoCE ; OOB eth0:10.0.1.2<0>\n"
        "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IBext_v6/1\n"
        "h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IBext_v6/1\n"
    )
    assert nccl.network == "IBext_v6"
    assert nccl_verdict("h", ENFORCE, nccl, ["mlx5_0:1", "mlx5_1:1"]).verdict == "pass"


def test_channels_over_sockets_are_the_fallback_too():
    nccl = parse_nccl_log("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n")
    assert nccl.network == "Socket"
    assert nccl_verdict("h", ENFORCE, nccl, ["mlx5_0:1"]).refusal


@pytest.mark.parametrize("name", ["UCX", "AWS Libfabric"])
def test_a_plugin_without_an_ib_device_line_is_not_taken_for_sockets(name):
    nccl = parse_nccl_log(f"h:1:2 [0] NCCL INFO Using network {name}\n")
    assert nccl.network == name  # the whole name, spaces and all
    verdict = nccl_verdict("h", ENFORCE, nccl, ["mlx5_0:1"])
    assert verdict.verdict == "pass" and verdict.refusal is None
    (warning,) = verdict.warnings
    assert f"network plugin {name}" in warning and "NET/IB : Using" in warning


def test_a_plugin_that_failed_to_load_is_not_the_internal_ib_failing():
    nccl = parse_nccl_log("NCCL INFO Failed to initialize NET plugin IBext\nNCCL INFO Using network IB\n")
    assert not nccl.ib_failed and nccl.network == "IB"
    assert parse_nccl_log("NCCL INFO Failed to initialize NET plugin IB\n").ib_failed


def test_several_communicators_name_every_network_once():
    said = ("NCCL INFO Using network IB", "NCCL INFO Using network Socket", "NCCL INFO Using network IB")
    nccl = parse_nccl_log("\n".join(said))
    assert nccl.network == "IB,Socket"
    assert nccl.lines == ("NCCL INFO Using network IB", "NCCL INFO Using network Socket")
    assert nccl_verdict("h", ENFORCE, nccl, ["x:1"]).refusal


NETWORK_LINES = [
    "NCCL INFO Using network IB",
    "NCCL INFO Using network IBext",
    "NCCL INFO Using network IBext_v6",
    "NCCL INFO Using network IBext_v8",
    "NCCL INFO Using network UCX",
    "NCCL INFO Using network AWS Libfabric",
    "NCCL INFO Using network Socket",
    "NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IBext_v6/1",
    "NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    "NCCL INFO NCCL_IB_HCA set to x:1",
]


@pytest.mark.parametrize("line", NETWORK_LINES)
def test_the_bench_cause_and_the_verdict_agree_on_sockets(line):
    """The bench reads the serving log's network name; the verdict reads a node's log: one function
    (`nccl.on_sockets`) decides for both, so they never disagree on what is the TCP fallback."""
    from components.node_programs.serve_bench import nccl_network
    from components.serve_bench.plan import likely_causes

    nccl = parse_nccl_log(line)
    verdict = nccl_verdict("h", ENFORCE, nccl, ["x:1"])
    network = nccl_network([f"h:1:2 [0] {line}"])
    assert network == nccl.network
    (cause,) = [c for c in likely_causes(None, network, ["a", "b"]) if "NCCL" in c]
    sockets = "Socket" in line
    assert ("(TCP sockets, not RDMA)" in cause) is sockets
    assert any("fell back to TCP sockets" in p for p in verdict.problems) is sockets
