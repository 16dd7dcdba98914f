"""Benchmark NodeImage in the lab against the plain pipeline; prints a table (figures, not asserts).

For each node pair: an image of 4 x 100 MB incompressible layers on busybox plus a 10 MB top layer.
Cases: fresh full copy, unchanged image, changed top layer (three runs, each with a new top layer;
the figure is the median run's, with the spread of the three ratios, and the seconds a thin copy
takes: the fixed cost the operator waits for on every `up` that changes a layer), the same on a
300 MB image (the first three of those layers); and the raw SSH throughput as a ceiling.
"ours" is the default (layers read from a classic overlay2 source's layer store); "ours, docker
save" forces the `docker save | filter` path (what an OCI/containerd source or a non-root user gets).
A containerd-store destination leaves out the layers whose blobs its content store holds.
Last, the slow-login-shell case: both nodes' homes get a `~/.bashrc` that costs 0.1 s (as `conda
init` or `pyenv init` do), and the SSH sessions each create opens on the nodes are counted.
Then the checkpoint, the engine and the health watchdog (`python -m bench checkpoint|engine|health`
runs one alone; `python -m bench real` the engine's real-vLLM rows alone, `python -m bench
health-real` the watchdog's against the real engine alone).
"""

from __future__ import annotations

import secrets
import sys
import time

import lab
from bench import checkpoint as checkpoint_bench
from bench import engine as engine_bench
from bench import health as health_bench
from bench import median_run, spread
from components.node_image import Node, NodeImageProvider, Tuning, peer_target
from components.remote import bash_argv, shell_join, ssh_argv
from components.transfer.peer import NODE_PYTHON
from lab.logins import counted_logins
from tests.support.lab_nodes import node_dict

BASE = "bench-base:2"
IMAGE = "bench-image:1"
# The previous build keeps its own tag on the node, as the deployment's content-hash tags do.
PREVIOUS = "bench-image:previous"
BASE_MB = (100, 100, 100, 100)
# The changed-top-layer case on two image sizes: the ratio grows with the image, the thin copy's
# seconds should not. The smaller base is the larger one's first layers (the build cache's).
SIZES = ((len(BASE_MB), "400 MB image"), (3, "300 MB image"))
TOP_MB = 10
REPEATS = 3  # runs of each changed-top-layer case (the figure is their median)
PAIRS = (
    ("node-a", "node-b", "20.10 -> 20.10"),
    ("node-c", "node-a", "26 OCI -> 20.10"),
    ("node-c", "node-d", "26 -> 26 containerd"),  # every layer sent by design: thin is unsafe there
)


def base_ref(layers: int = len(BASE_MB)) -> str:
    return BASE if layers == len(BASE_MB) else f"{BASE}-{layers}"


def build_base(node: lab.LabNode, layers: int = len(BASE_MB)) -> None:
    steps = "".join(
        f"RUN dd if=/dev/urandom of=/base{i} bs=1M count={mb} status=none\n"
        for i, mb in enumerate(BASE_MB[:layers])
    )
    dockerfile = f"FROM lab-busybox:1\n{steps}"
    if lab.docker(node, "image", "inspect", base_ref(layers), check=False).returncode != 0:
        lab.on_node(
            node,
            ["docker", "build", "--network", "host", "-q", "-t", base_ref(layers), "-"],
            input=_context(dockerfile),
            timeout=900,
        )


def build_top(node: lab.LabNode, base: str = BASE) -> None:
    nonce = secrets.token_hex(4)
    dd = f"dd if=/dev/urandom of=/top bs=1M count={TOP_MB} status=none"
    dockerfile = f"FROM {base}\nRUN echo {nonce} > /nonce && {dd}\n"
    lab.on_node(
        node,
        ["docker", "build", "--network", "host", "-q", "-t", IMAGE, "-"],
        input=_context(dockerfile),
        timeout=900,
    )


def _context(dockerfile: str) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def clear(node: lab.LabNode) -> None:
    for ref in (IMAGE, PREVIOUS, *(base_ref(layers) for layers, _ in SIZES)):
        lab.docker(node, "image", "rm", "-f", ref, check=False)
    lab.docker(node, "image", "prune", "-f", check=False)


def peer_ssh(dst: lab.LabNode, argv: list[str]) -> list[str]:
    """The source's ssh to the destination, with the same options NodeImage uses (its dialer too)."""
    target = peer_target(Node.from_dict("destination", node_dict(dst)), Tuning())
    return ssh_argv(target, argv, dial_with=NODE_PYTHON)


def timed(node: lab.LabNode, script: str) -> float:
    started = time.monotonic()
    lab.on_node(node, bash_argv(script), timeout=1800)
    return time.monotonic() - started


def plain_copy(src: lab.LabNode, dst: lab.LabNode) -> float:
    load = shell_join(peer_ssh(dst, ["docker", "load"]))
    return timed(src, f"set -o pipefail; docker save {IMAGE} | {load} | tail -3")


def ours(
    provider: NodeImageProvider, src: lab.LabNode, dst: lab.LabNode, export: str = "auto"
) -> tuple[float, dict]:
    """One NodeImage create; `export="save"` forces the `docker save` path."""
    started = time.monotonic()
    props = {"image": IMAGE, "source": node_dict(src), "destination": node_dict(dst)}
    outs = provider.create({**props, "tuning": {"source_export": export}}).outs
    return time.monotonic() - started, outs


def save_bytes(node: lab.LabNode) -> int:
    return int(lab.on_node(node, bash_argv(f"docker save {IMAGE} | wc -c"), timeout=900).out)


def bench_pair(src: lab.LabNode, dst: lab.LabNode, label: str) -> list[tuple]:
    """Rows: (engines, case, plain s, ours s, ours via docker save s, plain bytes, ours bytes, figure)."""
    provider = NodeImageProvider()
    lab.busybox_image(src)
    lab.busybox_image(dst)
    build_base(src)
    build_top(src)
    # raw link: a file from the page cache through the same ssh (file made first, then timed)
    lab.on_node(src, bash_argv("head -c 300M /dev/urandom > /tmp/bench-raw"))
    sink = shell_join(peer_ssh(dst, ["dd", "of=/dev/null", "bs=1M", "status=none"]))
    raw_s = timed(src, f"cat /tmp/bench-raw | {sink}")
    lab.on_node(src, ["rm", "-f", "/tmp/bench-raw"])
    total = save_bytes(src)
    rows = [
        (
            label,
            "raw SSH link (300 MB)",
            raw_s,
            None,
            None,
            300 * 2**20,
            None,
            f"{300 / raw_s:.0f} MB/s ceiling",
        )
    ]

    clear(dst)
    plain_s = plain_copy(src, dst)
    clear(dst)
    save_s, _ = ours(provider, src, dst, "save")
    clear(dst)
    ours_s, outs = ours(provider, src, dst)
    note = f"ours/plain {ours_s / plain_s:.2f} (target <= 1.1)"
    rows.append((label, "fresh full copy", plain_s, ours_s, save_s, total, outs["bytes_sent"], note))

    ours_s, outs = ours(provider, src, dst)
    ok = outs["layer_bytes_sent"] == 0 and ours_s < 2
    note = f"{'ok' if ok else 'MISS'}: 0 layer bytes, < 2 s"
    rows.append((label, "unchanged image", None, ours_s, None, total, outs["bytes_sent"], note))

    for layers, size in SIZES:
        rows.append(changed_top(provider, src, dst, label, layers, size))
    clear(dst)
    return rows


def changed_top(
    provider: NodeImageProvider, src: lab.LabNode, dst: lab.LabNode, label: str, layers: int, size: str
) -> tuple:
    """The changed-top-layer row on an image of `layers` base layers: the destination holds the
    previous image (its own tag), each run brings a new top layer."""
    base = base_ref(layers)
    build_base(src, layers)
    build_top(src, base)
    ours(provider, src, dst)  # the destination holds this base (nothing to send when it already did)
    lab.docker(dst, "tag", IMAGE, PREVIOUS)
    runs = []
    for _ in range(REPEATS):  # sub-second timings: the median of a few runs, with their spread
        build_top(src, base)
        plain_s = plain_copy(src, dst)  # the destination keeps the base layers (the previous image)
        lab.docker(dst, "image", "rm", "-f", IMAGE, check=False)
        save_s, _ = ours(provider, src, dst, "save")
        lab.docker(dst, "image", "rm", "-f", IMAGE, check=False)
        ours_s, outs = ours(provider, src, dst)
        runs.append((plain_s, ours_s, save_s, outs))
    plain_s, ours_s, save_s, outs = median_run(runs, faster)
    top = TOP_MB * 2**20
    note = (
        f"sent {outs['bytes_sent'] / top:.2f} x layer (<= 1.2), {plain_s / ours_s:.1f}x faster (>= 5; "
        f"{spread(runs, faster, 1, 'x')}), thin copy {median_run(runs, thin_s)[1]:.2f} s "
        f"({spread(runs, thin_s, 2, ' s')})"
    )
    return (
        label,
        f"changed top layer, {size}",
        plain_s,
        ours_s,
        save_s,
        save_bytes(src),
        outs["bytes_sent"],
        note,
    )


def faster(run: tuple) -> float:
    """plain s / ours s of a run `(plain s, ours s, …)`."""
    return run[0] / run[1]


def thin_s(run: tuple) -> float:
    """ours s of a run `(plain s, ours s, …)`: what a thin copy costs whatever the image's size."""
    return run[1]


def mb(value) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def sec(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def bench_slow_shell(src: lab.LabNode, dst: lab.LabNode) -> list[tuple]:
    """Changed top layer, 20.10 -> 20.10, with a 0.1 s login shell on both nodes."""
    provider = NodeImageProvider()
    label = "20.10 -> 20.10, 0.1 s ~/.bashrc"
    build_base(src)
    build_top(src)
    ours(provider, src, dst)  # the destination holds the base
    lab.docker(dst, "tag", IMAGE, PREVIOUS)
    runs = []
    with counted_logins(src, dst, costs_s=0.1) as counts:

        def sessions() -> int:
            return sum(counts().values())

        for _ in range(REPEATS):
            build_top(src)
            before = sessions()
            plain_s = plain_copy(src, dst)
            plain_sessions = sessions() - before
            lab.docker(dst, "image", "rm", "-f", IMAGE, check=False)
            before = sessions()
            ours_s, outs = ours(provider, src, dst)
            runs.append((plain_s, ours_s, plain_sessions, sessions() - before, outs))
    plain_s, ours_s, plain_sessions, ours_sessions, outs = median_run(runs, faster)
    top = TOP_MB * 2**20
    note = (
        f"{plain_s / ours_s:.1f}x faster (>= 5; {spread(runs, faster, 1, 'x')}), thin copy "
        f"{median_run(runs, thin_s)[1]:.2f} s, sent {outs['bytes_sent'] / top:.2f} x layer; SSH sessions "
        f"per create: ours {ours_sessions}, plain {plain_sessions}"
    )
    rows = [(label, "changed top layer", plain_s, ours_s, None, save_bytes(src), outs["bytes_sent"], note)]
    clear(dst)
    return rows


def main() -> int:
    if sys.argv[1:] == ["checkpoint"]:
        return checkpoint_bench.main()
    if sys.argv[1:] == ["engine"]:
        return engine_bench.main()
    if sys.argv[1:] == ["real"]:
        return engine_bench.main_real()
    if sys.argv[1:] == ["health"]:
        return health_bench.main()
    if sys.argv[1:] == ["health-real"]:
        return health_bench.main_real()
    nodes = lab.up([name for pair in PAIRS for name in pair[:2]])
    rows = []
    cases = [
        (f"{label} ({src} -> {dst})", bench_pair, nodes[src], nodes[dst], label) for src, dst, label in PAIRS
    ]
    cases.append(
        ("slow login shell (node-a -> node-b)", bench_slow_shell, nodes["node-a"], nodes["node-b"], None)
    )
    for title, run, src, dst, label in cases:
        print(f"bench: {title} ...", file=sys.stderr, flush=True)
        try:
            rows += run(src, dst, label) if label else run(src, dst)
        except Exception as exc:  # one case failing must not hide the others' figures
            first = str(exc).strip().splitlines()[-1][:120]
            rows.append((label or title, "ERROR", None, None, None, None, None, first))
    header = (
        "engines",
        "case",
        "plain s",
        "ours s",
        "ours, docker save s",
        "plain MB",
        "ours MB sent",
        "figure",
    )
    table = [header] + [(r[0], r[1], sec(r[2]), sec(r[3]), sec(r[4]), mb(r[5]), mb(r[6]), r[7]) for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for index, row in enumerate(table):
        print(" | ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("-+-".join("-" * width for width in widths))
    print()
    checkpoint_bench.main(nodes)
    print()
    engine_bench.main()
    print()
    health_bench.main(nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
