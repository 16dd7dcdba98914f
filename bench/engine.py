"""`python -m bench engine`: the real Pulumi engine on two lab nodes, wall times of what an operator
runs: `pulumi preview`, the first `pulumi up`, a no-op `up`, an upgrade to an image with one new top
layer, and the rollback to the previous image (the previous config and one `up`): the seconds from
its start to the containers restarted, and the image bytes it sent (0: the nodes kept the image).
Then the committed hybrid (Pulumi.lab.yaml): a first `up` that builds it on node-a, a no-op `up`, a
rebuild after a one-file change under patches/, and the plain alternative, `docker build` over SSH
after the same kind of change, with the ratio of ImageBuild's build step to it.

Each `up --json` is read line by line, every engine event stamped on arrival (the events' own
timestamps are whole seconds)."""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lab
from components.config import ImageConfig
from components.hybrid_image import PATCH_DIR, build_args, dockerfile, hybrid_ref
from engine import ROOT, Engine, ensure_engine
from engine.lab_stack import engine_lab_config, lab_image_config, stack_file, write_config
from lab.ray_image import ray_image
from lab.sessions import lab_session
from lab.standin_hub import StandinHub, generate_repo
from lab.vllm_images import folder_context, lab_build_inputs

STACK = "bench-engine"
HYBRID_STACK = "bench-engine-hybrid"
IMAGE_BUILD = "pulumi-python:dynamic/qwen35:ImageBuild"
# A file under patches/ only the bench writes (patches/wheels/ is ignored by git; the context has it).
MARKER = PATCH_DIR / "wheels" / "bench-changed-file.txt"
REPO_ID = "lab/standin-qwen35"
NODE_IMAGE = "pulumi-python:dynamic/qwen35:NodeImage"
CONTAINER = "docker:index/container:Container"
MODEL_SUPPORT = "pulumi-python:dynamic/qwen35:ModelSupportCheck"
TOP_MB = 48


@dataclass
class Step:
    """One resource step as the engine reported it: (type, name, op), when it began and ended."""

    type: str
    name: str
    op: str
    began: float | None = None
    ended: float | None = None


@dataclass
class Run:
    """One `pulumi up --json`, its events stamped with this machine's monotonic clock on arrival."""

    returncode: int
    started: float
    ended: float
    events: list[tuple[float, dict]]
    err: str
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        open_steps: dict[tuple[str, str], Step] = {}
        for stamp, event in self.events:
            for kind in ("resourcePreEvent", "resOutputsEvent"):
                meta = (event.get(kind) or {}).get("metadata")
                if not meta or meta["op"] in ("same", "read", "refresh"):
                    continue
                key = (meta["urn"], meta["op"])
                if kind == "resourcePreEvent":
                    step = Step(meta["type"], meta["urn"].rsplit("::", 1)[-1], meta["op"], began=stamp)
                    open_steps[key] = step
                    self.steps.append(step)
                elif key in open_steps:
                    open_steps.pop(key).ended = stamp

    @property
    def seconds(self) -> float:
        return self.ended - self.started

    def text(self) -> str:
        return json.dumps([e for _, e in self.events]) + self.err

    def of(self, type_: str, suffix: str = "") -> list[Step]:
        return [s for s in self.steps if s.type == type_ and s.name.endswith(suffix)]


def up(engine: Engine, stack: str, timeout: float = 1800) -> Run:
    """`pulumi up --yes --skip-preview --json`, read line by line so each event carries its time."""
    argv = [str(engine.pulumi), "up", "--yes", "--skip-preview", "--json", "--non-interactive"]
    argv += ["--stack", stack]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=engine.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    events = []
    for line in proc.stdout:
        if line.strip().startswith("{"):
            events.append((time.monotonic(), json.loads(line)))
    proc.wait(timeout=timeout)
    reader.join(timeout=10)
    return Run(proc.returncode, started, time.monotonic(), events, "".join(err))


def build_image(node: lab.LabNode, base: str, tag: str, run: str) -> str:
    """`docker build` on the node FROM `base` with one RUN step (one new top layer): the new tag."""
    dockerfile = f"FROM {base}\nRUN {run}\n".encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    lab.docker(node, "build", "--network", "host", "-q", "-t", tag, "-", input=buffer.getvalue(), timeout=900)
    return tag


def top_layer_image(node: lab.LabNode, base: str, top_mb: int = TOP_MB) -> str:
    """`base` plus one new top layer of `top_mb` random MB, tagged `<name>:upgrade-<nonce>`."""
    nonce = secrets.token_hex(3)
    dd = f"dd if=/dev/urandom of=/upgrade.bin bs=1M count={top_mb} status=none"
    return build_image(
        node, base, f"{base.rpartition(':')[0]}:upgrade-{nonce}", f"echo {nonce} > /upgrade && {dd}"
    )


def node_images(engine: Engine, stack: str) -> dict[str, dict]:
    """name -> outputs of the live NodeImage resources in the engine's state."""
    done = engine.run("stack", "export", stack=stack)
    state = json.loads(done.out)
    return {
        r["urn"].rsplit("::", 1)[-1]: r.get("outputs") or {}
        for r in state["deployment"].get("resources") or []
        if r["type"] == NODE_IMAGE and not r.get("delete")
    }


def prebuilt(ref: str) -> dict:
    return {"strategy": "prebuilt", "prebuilt": ref, "model_check": "report"}


@contextlib.contextmanager
def bench_stack(engine: Engine, name: str, config: dict) -> Iterator[None]:
    """A stack `name` with `config` and both secrets; destroyed and removed afterwards."""
    path = stack_file(name)
    path.unlink(missing_ok=True)
    try:
        engine.run("stack", "init", name)
        write_config(path, config)
        for key in ("api_key", "hf_token"):
            engine.run(
                "config", "set", "--secret", f"qwen35-spark:{key}", stack=name,
                stdin=f"{key}-bench-{secrets.token_hex(8)}",
            )  # fmt: skip
        yield
    finally:
        engine.run("destroy", "--yes", stack=name, check=False, timeout=900)
        engine.run("stack", "rm", "--yes", "--force", stack=name, check=False)
        path.unlink(missing_ok=True)


def main() -> int:
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as folder, lab_session(["node-a", "node-b"]) as nodes:
        engine = ensure_engine(backend=Path(folder))
        image, _ = ray_image(nodes["node-a"])
        for name in nodes:  # a first up that fetches and copies for real
            subprocess.run(["rm", "-rf", f"/run/qwen35-lab/{name}/hf-cache"], check=False)
        repo = generate_repo(Path(folder) / "repo", shards=2, shard_bytes=2 << 20)
        with StandinHub({REPO_ID: repo}) as hub:
            config = engine_lab_config(image, hub.endpoint)
            with bench_stack(engine, STACK, config):
                rows += measure(engine, nodes, config, image)
            hybrid = engine_lab_config(None, hub.endpoint)
            lab_build_inputs(nodes["node-a"], lab_image_config(hybrid), PATCH_DIR)
            with bench_stack(engine, HYBRID_STACK, hybrid):
                rows += measure_hybrid(engine, nodes, hybrid)
    widths = [max(len(r[i]) for r in [("case", "seconds", "figure"), *rows]) for i in range(3)]
    for index, row in enumerate([("case", "seconds", "figure"), *rows]):
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("-+-".join("-" * width for width in widths))
    return 0


def build_seconds(run: Run) -> float:
    """How long the ImageBuild step took (nan when the run had none)."""
    done = [
        s for s in run.of(IMAGE_BUILD) if s.began and s.ended and s.op in ("create", "create-replacement")
    ]
    return done[0].ended - done[0].began if done else float("nan")


def plain_build(node: lab.LabNode, image: ImageConfig) -> float:
    """The plain alternative, timed: `docker build` of patches/ over SSH with the same Dockerfile and
    args, after a one-file change as the rebuild had (so the same layers are cached); then removed."""
    MARKER.write_text(f"plain {secrets.token_hex(8)}\n")
    tag = f"bench-plain:{secrets.token_hex(4)}"
    argv = [
        "docker",
        "build",
        "--force-rm",
        "--file",
        dockerfile(image),
        "--tag",
        tag,
        "--platform",
        image.platform,
    ]
    argv += ["--network", image.build_network] if image.build_network else []
    for key, value in build_args(image).items():
        argv += ["--build-arg", f"{key}={value}"]
    started = time.monotonic()
    lab.on_node(node, [*argv, "-"], input=folder_context(PATCH_DIR), timeout=900)
    seconds = time.monotonic() - started
    lab.docker(node, "image", "rm", tag, check=False)
    return seconds


def measure_hybrid(engine: Engine, nodes: dict[str, lab.LabNode], config: dict) -> list[tuple]:
    """The committed hybrid under the engine: a first up that builds, a no-op up, a one-file rebuild,
    and a plain `docker build` after the same kind of change, in the same run."""
    image = lab_image_config(config)
    MARKER.unlink(missing_ok=True)
    for node in nodes.values():  # the first up builds and copies for real
        lab.docker(node, "image", "rm", hybrid_ref(image), check=False)
    rows = []
    try:
        first = up(engine, HYBRID_STACK)
        if first.returncode:
            raise SystemExit(f"bench engine: hybrid first up failed:\n{first.err[-3000:]}")
        rows.append(("hybrid: first up (build on node-a)", f"{first.seconds:.1f}",
                     f"build step {build_seconds(first):.1f} s; {len(first.steps)} steps"))  # fmt: skip
        noop = up(engine, HYBRID_STACK)
        rows.append(("hybrid: no-op up", f"{noop.seconds:.1f}",
                     f"{len(noop.steps)} changed steps, {len(noop.of(IMAGE_BUILD))} builds"))  # fmt: skip
        MARKER.write_text(f"rebuild {secrets.token_hex(8)}\n")
        again = up(engine, HYBRID_STACK)
        rebuilt = build_seconds(again)
        replaced = {s.name for s in again.of(CONTAINER) if s.op == "create-replacement"}
        rows.append(("hybrid: one-file rebuild up", f"{again.seconds:.1f}",
                     f"build step {rebuilt:.1f} s; {len(replaced)} containers replaced"))  # fmt: skip
        plain = plain_build(nodes["node-a"], image)
        rows.append(("plain docker build over SSH (same change)", f"{plain:.1f}",
                     f"ImageBuild's step / plain = {rebuilt / plain:.2f}"))  # fmt: skip
    finally:
        MARKER.unlink(missing_ok=True)
    return rows


def measure(engine: Engine, nodes: dict[str, lab.LabNode], config: dict, image: str) -> list[tuple]:
    rows = []
    preview = engine.run("preview", stack=STACK)
    rows.append(("preview (2 lab nodes)", f"{preview.seconds:.1f}", "no SSH to the nodes"))
    first = up(engine, STACK)
    if first.returncode:
        raise SystemExit(f"bench engine: first up failed:\n{first.err[-3000:]}")
    rows.append(("first up", f"{first.seconds:.1f}", f"{len(first.steps)} steps"))
    noop = up(engine, STACK)
    rows.append(("no-op up", f"{noop.seconds:.1f}", f"{len(noop.steps)} changed steps"))
    new = top_layer_image(nodes["node-a"], image)
    try:
        write_config(stack_file(STACK), {**config, "qwen35-spark:image": prebuilt(new)})
        upgrade = up(engine, STACK)
        sent = sum(o.get("bytes_sent") or 0 for o in node_images(engine, STACK).values())
        rows.append(
            ("upgrade (new top layer)", f"{upgrade.seconds:.1f}", f"{sent / 1e6:.1f} MB image bytes sent")
        )
        write_config(stack_file(STACK), config)
        back = up(engine, STACK)
        restarted = [s.ended for s in back.of(CONTAINER) if s.op == "create-replacement" and s.ended]
        sent = sum(o.get("bytes_sent") or 0 for o in node_images(engine, STACK).values())
        until = max(restarted) - back.started if restarted else float("nan")
        proofs = [s for s in back.of(MODEL_SUPPORT) if s.op == "create-replacement" and s.ended]
        proof = f"model-support check {proofs[0].ended - proofs[0].began:.1f} s; " if proofs else ""
        touched = [s.began for s in back.of(CONTAINER) if s.began]
        first = f"first container step at {min(touched) - back.started:.1f} s; " if touched else ""
        rows.append(
            (
                "rollback: up -> containers restarted",
                f"{until:.1f}",
                f"{sent} image bytes sent; {proof}{first}up {back.seconds:.1f} s, exit {back.returncode}",
            )
        )
    finally:
        for node in nodes.values():
            lab.docker(node, "image", "rm", new, check=False)
    print(f"bench engine: {len(rows)} cases measured", file=sys.stderr)
    return rows
