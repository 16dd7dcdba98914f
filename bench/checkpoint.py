"""Benchmark the checkpoint copy in the lab (node-a -> node-b); prints a table (figures, not asserts).

The checkpoint: config, tokenizer files and 4 x 256 MiB random safetensors shards (1 GiB), fetched
once into node-a's HF cache from the stand-in Hub with the real `huggingface_hub` client. Cases, in
one run: the raw SSH link (`cat | ssh | dd`), `rsync -a` of the repo folder over the same SSH options
(verifies nothing) and our fresh copy (every byte hashed while received), alternately three times
(the median run is shown, with the spread of the ratios), the unchanged checkpoint, and one damaged
shard (found by a `full` check, only it re-sent).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import lab
from bench import median_run, spread
from components.checkpoint import CheckpointProvider
from components.checkpoint.programs import repo_dir_name
from components.remote import bash_argv, shell_join, ssh_argv, ssh_command, ssh_options
from components.transfer.peer import NODE_PYTHON
from lab.layout import data_dir
from lab.remote import ssh_target
from lab.standin_hub import StandinHub, generate_repo
from tests.support.lab_nodes import node_dict

REPO = "bench/qwen35-1g"
SHARDS = 4
SHARD_BYTES = 256 << 20
MIB = 1 << 20
REPEATS = 3  # fresh copies, ours and rsync's alternately (the figure is the median run's)


def over_rsync(run: tuple) -> float:
    """ours s / rsync s of a run `(rsync s, ours s, …)`."""
    return run[1] / run[0]


def cache_dir(node: lab.LabNode) -> Path:
    return data_dir() / "bench-hf-cache" / node.name


def say(message: str) -> None:
    print(f"bench: checkpoint: {message}", file=sys.stderr, flush=True)


def timed(node: lab.LabNode, script: str) -> float:
    started = time.monotonic()
    lab.on_node(node, bash_argv(script, pipefail=True), timeout=1800)
    return time.monotonic() - started


def props(src: lab.LabNode, dst: lab.LabNode, head: dict, refresh: str = "sizes") -> dict:
    return {
        "node": node_dict(dst),
        "repo": REPO,
        "requested_revision": "main",
        "cache_dir": str(cache_dir(dst)),
        "source": node_dict(src),
        "source_cache_dir": str(cache_dir(src)),
        "source_mode": "hub",
        "refresh": refresh,
        "keep": True,
        "reserve": 0,
        "tuning": {},
        "source_revision": head["revision"],
        "source_manifest": head["manifest"],
        "source_refs": head["refs"],
        "manifest_digest": head["digest"],
    }


def fetch_head(src: lab.LabNode, workdir: Path) -> dict:
    repo = generate_repo(workdir / "repo", shards=SHARDS, shard_bytes=SHARD_BYTES)
    with StandinHub({REPO: repo}) as hub:
        head = {
            "node": node_dict(src),
            "repo": REPO,
            "requested_revision": "main",
            "cache_dir": str(cache_dir(src)),
            "source": None,
            "source_mode": "hub",
            "refresh": "sizes",
            "keep": True,
            "reserve": 0,
            "fetch": {"python": sys.executable, "endpoint": hub.endpoint},
            "tuning": {},
        }
        return CheckpointProvider().create(head).outs


def rows(src: lab.LabNode, dst: lab.LabNode) -> list[tuple]:
    """(case, seconds, MB sent, figure) rows of one run."""
    provider = CheckpointProvider()
    head = seed(src, dst)
    out = copy_rows(provider, src, dst, head)
    out += again_rows(provider, src, dst, head)
    for node in (src, dst):
        shutil.rmtree(cache_dir(node), ignore_errors=True)
    return out


def seed(src: lab.LabNode, dst: lab.LabNode) -> dict:
    """Both nodes' caches emptied, then the checkpoint fetched into the source's: the head's outputs."""
    for node in (src, dst):
        shutil.rmtree(cache_dir(node), ignore_errors=True)
        cache_dir(node).mkdir(parents=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    say("generating 1 GiB and fetching it into node-a's cache from the stand-in Hub")
    try:
        return fetch_head(src, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def copy_rows(provider: CheckpointProvider, src: lab.LabNode, dst: lab.LabNode, head: dict) -> list[tuple]:
    """The fresh copy's rows: the raw SSH link's ceiling, then rsync and ours alternately (the median
    run's figures)."""
    total = head["bytes"]
    repo_src = cache_dir(src) / "hub" / repo_dir_name(REPO)
    out: list[tuple] = []

    say("raw SSH, rsync -a, ours")
    blobs = " ".join(shell_join([str(p)]) for p in sorted((repo_src / "blobs").iterdir()))
    # (run on the source: the node's ssh dialer, as ours uses for its connection to the destination)
    discard = ["dd", "of=/dev/null", "bs=1M", "status=none"]
    sink = shell_join(ssh_argv(ssh_target(dst), discard, dial_with=NODE_PYTHON))
    timed(src, f"cat {blobs} > /dev/null")  # page cache warm for every case alike
    raw_s = timed(src, f"cat {blobs} | {sink}")
    out.append(("raw SSH link (same bytes)", raw_s, total / MIB, f"{total / MIB / raw_s:.0f} MiB/s ceiling"))

    rsync_dest = cache_dir(dst) / "rsync" / repo_dir_name(REPO)
    rsh = shell_join([*ssh_command(NODE_PYTHON), *ssh_options(ssh_target(dst), dial_with=NODE_PYTHON)])
    rsync = shell_join(["rsync", "-a", "-e", rsh, f"{repo_src}/", f"{dst.user}@{dst.host}:{rsync_dest}/"])
    runs = []  # (rsync s, ours s, ours' outputs), alternately, into empty destinations
    for _ in range(REPEATS):
        shutil.rmtree(rsync_dest.parent, ignore_errors=True)
        lab.on_node(dst, ["mkdir", "-p", str(rsync_dest.parent)])
        rsync_s = timed(src, rsync)
        shutil.rmtree(rsync_dest.parent, ignore_errors=True)
        shutil.rmtree(cache_dir(dst) / "hub", ignore_errors=True)
        started = time.monotonic()
        fresh = provider.create(props(src, dst, head)).outs
        runs.append((rsync_s, time.monotonic() - started, fresh))
        assert fresh["digest"] == head["digest"], "the copy's digest differs from the head's"
    rsync_s, fresh_s, fresh = median_run(runs, over_rsync)
    out.append(("rsync -a (no verification)", rsync_s, total / MIB, f"{total / MIB / rsync_s:.0f} MiB/s"))
    out.append(
        (
            "ours: fresh copy, hashed",
            fresh_s,
            fresh["bytes_sent"] / MIB,
            f"ours/rsync {fresh_s / rsync_s:.2f} (target <= 1.1; {spread(runs, over_rsync, 2)}); "
            f"{100 * raw_s / fresh_s:.0f}% of raw SSH",
        )
    )
    return out


def again_rows(provider: CheckpointProvider, src: lab.LabNode, dst: lab.LabNode, head: dict) -> list[tuple]:
    """The copy again over what is there: unchanged (nothing sent), then one damaged shard (found by a
    `full` check, only it re-sent)."""
    out: list[tuple] = []
    started = time.monotonic()
    unchanged = provider.create(props(src, dst, head)).outs
    unchanged_s = time.monotonic() - started
    verdict = "ok" if unchanged["bytes_sent"] == 0 and unchanged_s <= 1.0 else "MISSED"
    out.append(("ours: unchanged", unchanged_s, unchanged["bytes_sent"] / MIB, f"{verdict}: 0 bytes, <= 1 s"))

    damage_shard(dst, head)
    started = time.monotonic()
    found = provider.read("x", {**unchanged, "refresh": "full"}).outs["problems"]
    check_s = time.monotonic() - started
    out.append(("full re-hash finds it", check_s, 0.0, f"problems: {found}"))
    started = time.monotonic()
    repaired = provider.update("x", unchanged, props(src, dst, head, refresh="full")).outs
    repair_s = time.monotonic() - started
    ratio = repaired["bytes_sent"] / SHARD_BYTES
    out.append(
        (
            "ours: one damaged shard",
            repair_s,
            repaired["bytes_sent"] / MIB,
            f"{repaired['files_sent']} file sent, {ratio:.3f} x its size (target <= 1.05); "
            "time incl. a full re-hash",
        )
    )
    return out


def damage_shard(dst: lab.LabNode, head: dict) -> None:
    """One byte of the second shard's blob in the destination's cache flipped."""
    shard = next(b for p, b, _s in head["manifest"] if p.endswith(f"00002-of-{SHARDS:05d}.safetensors"))
    with open(cache_dir(dst) / "hub" / repo_dir_name(REPO) / "blobs" / shard, "r+b") as handle:
        handle.seek(SHARD_BYTES // 2)
        byte = handle.read(1)
        handle.seek(SHARD_BYTES // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))


def print_table(table_rows: list[tuple]) -> None:
    header = ("checkpoint 1 GiB, 4 shards (node-a -> node-b)", "s", "MiB sent", "figure")
    table = [header] + [(r[0], f"{r[1]:.2f}", f"{r[2]:.1f}", r[3]) for r in table_rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for index, row in enumerate(table):
        print(" | ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("-+-".join("-" * width for width in widths))


def main(nodes: dict[str, lab.LabNode] | None = None) -> int:
    """`python -m bench checkpoint`: this table only (the lab nodes it starts are stopped after)."""
    if nodes is None:
        from lab.sessions import lab_session

        with lab_session(["node-a", "node-b"]) as started:
            return main(started)
    print("bench: checkpoint copy (node-a -> node-b) ...", file=sys.stderr, flush=True)
    print_table(rows(nodes["node-a"], nodes["node-b"]))
    return 0
