"""The node proof program's bus bandwidth, as nccl-tests computes it: busbw = algbw x 2(n-1)/n. The
program's own arithmetic, and its sized all-reduce step run here with a stand-in torch (the unit tier
has none; tests/release/test_node_proof_program.py runs it with the real one)."""

from __future__ import annotations

import sys
import time
import types

import pytest

from components.node_programs import node_proof


@pytest.mark.parametrize(("world", "busbw"), [(2, 1.0), (3, 4 / 3), (4, 1.5)])
def test_busbw_is_algbw_times_2_n_minus_1_over_n(world, busbw):
    figures = node_proof.bandwidth(size=2_000_000_000, seconds=2.0, world=world)
    assert figures["algbw_gbs"] == pytest.approx(1.0)
    assert figures["busbw_gbs"] == pytest.approx(busbw)


class Tensor:
    """As much of a torch tensor as the group steps touch."""

    def __init__(self, count: int, value: float):
        self.values = [value] * count

    def __eq__(self, other):  # torch compares elementwise; `.all()` then `bool()`
        return types.SimpleNamespace(all=lambda: all(v == other for v in self.values))

    def tolist(self):
        return list(self.values)


def stand_in_torch(world: int) -> types.ModuleType:
    """A torch whose all-reduce sums as a group of `world` ranks numbered 1..world would."""

    def all_reduce(tensor):
        time.sleep(0.001)  # a measurable time, whatever the clock's resolution
        tensor.values = [world * (world + 1) / 2] * len(tensor.values)

    joined = []
    dist = types.ModuleType("torch.distributed")
    dist.init_process_group = lambda *args, **kwargs: joined.append(kwargs)
    dist.is_initialized = lambda: bool(joined)
    dist.destroy_process_group = joined.clear
    dist.all_reduce = all_reduce
    torch = types.ModuleType("torch")
    torch.distributed = dist
    torch.float32 = "float32"
    torch.full = lambda shape, value, device: Tensor(shape[0], value)
    torch.ones = lambda count, dtype, device: Tensor(min(count, 8), 1.0)
    return torch


@pytest.mark.parametrize("world", [2, 3])
def test_the_sized_all_reduce_reports_busbw_from_algbw_at_its_world_size(monkeypatch, world):
    torch = stand_in_torch(world)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", torch.distributed)
    monkeypatch.setattr(node_proof, "REPORT", {"steps": {}})
    spec = {"rank": 0, "world": world, "master_addr": "127.0.0.1", "port": 29590, "deadline_s": 30,
            "bytes": 4 << 20, "iterations": 3}  # fmt: skip
    assert node_proof.group_steps(torch, spec, "gloo")
    sized = node_proof.REPORT["steps"]["sized_all_reduce"]
    assert sized["ok"] and sized["bytes"] == 4 << 20
    assert sized["algbw_gbs"] == pytest.approx(sized["bytes"] / sized["seconds"] / 1e9)
    assert sized["busbw_gbs"] == pytest.approx(sized["algbw_gbs"] * 2 * (world - 1) / world)
