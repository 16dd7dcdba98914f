"""`python -m bench engine`: the real Pulumi engine on two lab nodes, wall times of what an operator
runs: `pulumi preview`, the first `pulumi up`, a no-op `up`, an upgrade to an image with one new top
layer, and the rollback to the previous image (the previous config and one `up`): the seconds from
its start to the containers restarted, and the image bytes it sent (0: the nodes kept the image).
The upgrade and the rollback each report their outage: the longest gap between answered
completions (the Prober's) while the `up` ran. The same cases then run for the stack under
`cluster.executor: mp`, so the table shows ray and mp side by side.
Then the committed hybrid (Pulumi.lab.yaml): a first `up` that builds it on node-a, a no-op `up`, a
rebuild after a one-file change under patches/, and the plain alternative, `docker build` over SSH
after the same kind of change, with the ratio of ImageBuild's build step to it.
Last, the real engine (rows "real …"): the real-vLLM image's size and first build, and the same cases
on engine/real_vllm.yaml, where every load, outage and completion is vLLM's own; with, from the
readiness gate's stack output `cold_start` (vLLM's own log lines), the cold start of a first start
(the compile cache volume new), of a second start of the same image and flags (`up --replace` of the
serving containers: every cache kept), of the upgrade and of the rollback.

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

import openai

import lab
from components.config import ImageConfig
from components.image_build.component import PATCH_DIR, build_args, built_ref, dockerfile
from engine import ROOT, Engine, ensure_engine
from engine.lab_stack import (
    engine_lab_config,
    lab_image_config,
    mp_lab_config,
    real_answers,
    real_engine_config,
    stack_file,
    write_config,
)
from lab import tiny_qwen35
from lab.ray_image import ray_image
from lab.sessions import lab_session
from lab.standin_hub import StandinHub, generate_repo
from lab.vllm_cpu_image import build_record, vllm_cpu_image
from lab.vllm_images import folder_context, lab_build_inputs

STACK = "bench-engine"
MP_STACK = "bench-engine-mp"
HYBRID_STACK = "bench-engine-hybrid"
REAL_STACK = "bench-engine-real"
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


class Prober:
    """Chat completions against the endpoint, one after another, each stamped and judged."""

    def __init__(self, endpoint: str, model: str, api_key: str):
        self.client = openai.OpenAI(base_url=endpoint, api_key=api_key, timeout=3, max_retries=0)
        self.model = model
        self.answers: list[tuple[float, bool]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                reply = self.client.chat.completions.create(
                    model=self.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                ok = bool(reply.choices[0].message.content)
            except Exception:  # any failure is an unanswered request: that is what is measured
                ok = False
            self.answers.append((time.monotonic(), ok))
            time.sleep(0.05 if ok else 0.1)

    def __enter__(self) -> Prober:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=10)

    def answered_between(self, begin: float, end: float) -> int:
        return sum(1 for t, ok in self.answers if ok and begin <= t <= end)

    def outage(self, after: float = 0.0) -> tuple[float, float] | None:
        """(last answer of the old server, first of the new) around the first request unanswered
        at or after `after`."""
        last_ok = None
        for index, (stamp, ok) in enumerate(self.answers):
            if ok:
                last_ok = stamp
                continue
            if last_ok is None or stamp < after:
                continue
            later = [t for t, good in self.answers[index:] if good]
            return (last_ok, later[0]) if later else (last_ok, float("inf"))
        return None

    def longest_gap(self, begin: float, end: float) -> float:
        """The longest wait between answered completions stamped in [begin, end], its edges
        counted from the last answer before `begin` and up to the first after `end`."""
        good = [t for t, ok in self.answers if ok]
        before = [t for t in good if t < begin][-1:]
        after = [t for t in good if t > end][:1]
        stamps = before + [t for t in good if begin <= t <= end] + after
        if len(stamps) < 2:
            return float("inf")
        return max(later - earlier for earlier, later in zip(stamps, stamps[1:], strict=False))


def up(engine: Engine, stack: str, timeout: float = 1800, extra: tuple[str, ...] = ()) -> Run:
    """`pulumi up --yes --skip-preview --json`, read line by line so each event carries its time."""
    argv = [str(engine.pulumi), "up", "--yes", "--skip-preview", "--json", "--non-interactive"]
    argv += ["--stack", stack, *extra]
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
def bench_stack(engine: Engine, name: str, config: dict) -> Iterator[str]:
    """A stack `name` with `config` and both secrets; yields the API key; destroyed and removed after."""
    path = stack_file(name)
    path.unlink(missing_ok=True)
    values = {key: f"{key}-bench-{secrets.token_hex(8)}" for key in ("api_key", "hf_token")}
    try:
        engine.run("stack", "init", name)
        write_config(path, config)
        for key, value in values.items():
            engine.run("config", "set", "--secret", f"qwen35-spark:{key}", stack=name, stdin=value)
        yield values["api_key"]
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
            with bench_stack(engine, STACK, config) as api_key:
                rows += measure(engine, nodes, config, image, Bench(STACK, "ray", api_key))
            mp = mp_lab_config(config)
            with bench_stack(engine, MP_STACK, mp) as api_key:
                rows += measure(engine, nodes, mp, image, Bench(MP_STACK, "mp", api_key))
            hybrid = engine_lab_config(None, hub.endpoint)
            lab_build_inputs(nodes["node-a"], lab_image_config(hybrid), PATCH_DIR)
            with bench_stack(engine, HYBRID_STACK, hybrid):
                rows += measure_hybrid(engine, nodes, hybrid)
        rows += measure_real(engine, nodes, Path(folder))
    print_rows(rows)
    return 0


def main_real() -> int:
    """`python -m bench real`: the real engine's rows alone."""
    with tempfile.TemporaryDirectory() as folder, lab_session(["node-a", "node-b"]) as nodes:
        print_rows(measure_real(ensure_engine(backend=Path(folder)), nodes, Path(folder)))
    return 0


def print_rows(rows: list[tuple[str, str, str]]) -> None:
    widths = [max(len(r[i]) for r in [("case", "seconds", "figure"), *rows]) for i in range(3)]
    for index, row in enumerate([("case", "seconds", "figure"), *rows]):
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("-+-".join("-" * width for width in widths))


def measure_real(engine: Engine, nodes: dict[str, lab.LabNode], folder: Path) -> list[tuple]:
    """The real engine (vLLM's CPU build, engine/real_vllm.yaml): its image's size and first build,
    then the same cases as the other stacks, every figure from vLLM's own load and serving."""
    started = time.monotonic()
    tags = {vllm_cpu_image(node)[0] for node in nodes.values()}
    placed = time.monotonic() - started
    (image,) = tags
    record = build_record(image) or {}
    rows = [(
        "real: image (vLLM 0.32.0 CPU build)", f"{record.get('build_s', float('nan')):.1f}",
        f"{record.get('size_bytes', 0) / 1e9:.2f} GB; first build on {record.get('built_on', '?')} "
        f"(install + commit + save); this run placed it on both nodes in {placed:.1f} s",
    )]  # fmt: skip
    repo = tiny_qwen35.write(folder / "tiny")
    reference, made_s = timed_reference(nodes["node-a"], image, repo)
    with StandinHub({tiny_qwen35.REPO_ID: repo}) as hub:
        config = real_engine_config(image, hub.endpoint, reference)
        for node in nodes.values():  # the first start's compile cache is new (a destroy keeps the volume)
            lab.docker(node, "volume", "rm", f"{name_prefix(config)}-compile-cache", check=False)
        with bench_stack(engine, REAL_STACK, config) as api_key:
            bench = Bench(REAL_STACK, "real mp", api_key, cold_start=True)
            rows += measure(engine, nodes, config, image, bench)
            rows += answer_rows(engine, bench, reference, made_s)
    return rows


def timed_reference(node: lab.LabNode, image: str, repo: Path) -> tuple[Path, float]:
    """transformers' reference for the real stack's answer check, made anew (not from the cache), and
    the seconds it took."""
    from lab.answers_reference import make_reference, reference_path

    image_id = lab.docker(node, "image", "inspect", "--format", "{{.Id}}", image).out.strip()
    reference_path(image_id, repo, real_answers()).unlink(missing_ok=True)
    started = time.monotonic()
    made = make_reference(node, image, repo, real_answers())
    return made, time.monotonic() - started


def answer_rows(engine: Engine, bench: Bench, reference: Path, made_s: float) -> list[tuple]:
    """The answer check's own time: the reference's, the check's in the last `up` that ran it (its
    stack output), and the plain alternative, the same prompts sent once each as plain greedy
    completions without logprobs, timed here against the same server."""
    outputs = json.loads(engine.run("stack", "output", "--json", stack=bench.stack).out)
    answers = outputs["answers"]
    prompts = json.loads(reference.read_text())["prompts"]
    client = openai.OpenAI(base_url=outputs["endpoint"], api_key=bench.api_key, max_retries=0, timeout=120)
    started = time.monotonic()
    for entry in prompts.values():
        client.completions.create(
            model=outputs["served_model"], prompt=entry["prompt_ids"], max_tokens=len(entry["tokens"]),
            temperature=0,
        )  # fmt: skip
    plain = time.monotonic() - started
    checked = float(answers["elapsed_s"])
    return [
        ("real: answer reference (transformers, float32)", f"{made_s:.1f}",
         f"{len(prompts)} prompts, in the image on node-a; cached after"),
        ("real: answer check (teacher forcing)", f"{checked:.1f}",
         f"verdict {answers['verdict']} against {', '.join(answers['judged_against'])}; "
         f"{len(answers['receipts'])} prompts"),
        ("plain greedy completions (same prompts)", f"{plain:.1f}", f"check / plain = {checked / plain:.2f}"),
    ]  # fmt: skip


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
        lab.docker(node, "image", "rm", built_ref(image), check=False)
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


@dataclass(frozen=True)
class Bench:
    """One benched stack: its name, the executor it runs (the table's row prefix), its API key, and
    whether its server is vLLM itself (its log gives the cold start)."""

    stack: str
    executor: str
    api_key: str
    cold_start: bool = False


def cold_start_of(engine: Engine, stack: str) -> dict:
    """The stack output `cold_start`: the start the readiness gate last waited for."""
    done = engine.run("stack", "output", "cold_start", "--json", stack=stack, check=False)
    try:
        record = json.loads(done.out)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def start_figures(record: dict, first: dict | None = None) -> str:
    """`weights 28.2 s, engine 29.7 s, API 31.3 s, first completion 33.0 s` (after the container's
    start), with each figure's ratio to `first`'s when given."""
    names = (("weights_loaded_s", "weights"), ("engine_ready_s", "engine"), ("api_ready_s", "API"),
             ("first_completion_s", "first completion"))  # fmt: skip
    parts = []
    for key, label in names:
        value = record.get(key)
        if not isinstance(value, (int, float)):
            parts.append(f"{label} -")
            continue
        base = (first or {}).get(key)
        ratio = f" ({value / base:.2f}x the first)" if isinstance(base, (int, float)) and base > 0 else ""
        parts.append(f"{label} {value:.1f} s{ratio}")
    return ", ".join(parts) or "not measured"


def serving_urns(engine: Engine, stack: str, prefix: str) -> list[str]:
    """The URNs of the serving containers (the server and every rank: resource names from `prefix`)."""
    state = json.loads(engine.run("stack", "export", stack=stack).out)
    return [
        r["urn"]
        for r in state["deployment"].get("resources") or []
        if r["type"] == CONTAINER and not r.get("delete") and r["urn"].rsplit("::", 1)[-1].startswith(prefix)
    ]


def measure_starts(engine: Engine, config: dict, bench: Bench) -> list[tuple]:
    """The cold start of the first `up` (recorded before this), then of a second start of the same
    image and flags: every serving container replaced by `up --replace`, the compile cache volume,
    the HF cache and the nodes' page cache kept."""
    first = cold_start_of(engine, bench.stack)
    rows = [("cold start, first (compile cache volume new)", _api(first), start_figures(first))]
    urns = serving_urns(engine, bench.stack, f"{name_prefix(config)}-vllm")
    again = up(engine, bench.stack, extra=tuple(arg for urn in urns for arg in ("--replace", urn)))
    if again.returncode:
        raise SystemExit(f"bench engine: the second start's up failed:\n{again.err[-3000:]}")
    second = cold_start_of(engine, bench.stack)
    rows.append((
        f"cold start, second (same image and flags; {len(urns)} containers replaced)", _api(second),
        start_figures(second, first) + f"; up {again.seconds:.1f} s",
    ))  # fmt: skip
    return rows


def name_prefix(config: dict) -> str:
    return (config.get("qwen35-spark:containers") or {}).get("name_prefix", "qwen35")


def _api(record: dict) -> str:
    value = record.get("first_completion_s") or record.get("api_ready_s")
    return f"{value:.1f}" if isinstance(value, (int, float)) else "nan"


def probed_up(engine: Engine, bench: Bench) -> tuple[Run, float]:
    """One `up` with completions sent all along: the run and its outage, the longest gap between
    answered completions while it ran."""
    outputs = json.loads(engine.run("stack", "output", "--json", stack=bench.stack).out)
    with Prober(outputs["endpoint"], outputs["served_model"], bench.api_key) as prober:
        time.sleep(1.0)
        run = up(engine, bench.stack)
        time.sleep(1.0)
    return run, prober.longest_gap(run.started, run.ended)


def measure(
    engine: Engine, nodes: dict[str, lab.LabNode], config: dict, image: str, bench: Bench
) -> list[tuple]:
    """preview, first up, no-op up, upgrade and rollback of one stack, each row prefixed by its executor."""
    rows = []
    preview = engine.run("preview", stack=bench.stack)
    rows.append(("preview (2 lab nodes)", f"{preview.seconds:.1f}", "no SSH to the nodes"))
    first = up(engine, bench.stack)
    if first.returncode:
        raise SystemExit(f"bench engine: {bench.executor} first up failed:\n{first.err[-3000:]}")
    rows.append(("first up", f"{first.seconds:.1f}", f"{len(first.steps)} steps"))
    noop = up(engine, bench.stack)
    rows.append(("no-op up", f"{noop.seconds:.1f}", f"{len(noop.steps)} changed steps"))
    if bench.cold_start:
        rows += measure_starts(engine, config, bench)
    new = top_layer_image(nodes["node-a"], image)
    try:
        write_config(stack_file(bench.stack), {**config, "qwen35-spark:image": prebuilt(new)})
        upgrade, outage = probed_up(engine, bench)
        sent = sum(o.get("bytes_sent") or 0 for o in node_images(engine, bench.stack).values())
        started = (
            f"; cold start: {start_figures(cold_start_of(engine, bench.stack))}" if bench.cold_start else ""
        )
        rows.append(("upgrade (new top layer)", f"{upgrade.seconds:.1f}",
                     f"{sent / 1e6:.1f} MB image bytes sent; outage {outage:.1f} s{started}"))  # fmt: skip
        write_config(stack_file(bench.stack), config)
        back, outage = probed_up(engine, bench)
        seconds, figure = rollback_figures(engine, bench, back, outage)
        if bench.cold_start:
            figure += f"; cold start: {start_figures(cold_start_of(engine, bench.stack))}"
        rows.append(("rollback: up -> containers restarted", seconds, figure))
    finally:
        for node in nodes.values():
            lab.docker(node, "image", "rm", new, check=False)
    print(f"bench engine: {bench.executor}: {len(rows)} cases measured", file=sys.stderr)
    return [(f"{bench.executor}: {case}", seconds, figure) for case, seconds, figure in rows]


def rollback_figures(engine: Engine, bench: Bench, back: Run, outage: float) -> tuple[str, str]:
    """(seconds from `up` to the containers restarted, the figure) of a rollback run."""
    restarted = [s.ended for s in back.of(CONTAINER) if s.op == "create-replacement" and s.ended]
    sent = sum(o.get("bytes_sent") or 0 for o in node_images(engine, bench.stack).values())
    until = max(restarted) - back.started if restarted else float("nan")
    proofs = [s for s in back.of(MODEL_SUPPORT) if s.op == "create-replacement" and s.ended]
    proof = f"model-support check {proofs[0].ended - proofs[0].began:.1f} s; " if proofs else ""
    touched = [s.began for s in back.of(CONTAINER) if s.began]
    first = f"first container step at {min(touched) - back.started:.1f} s; " if touched else ""
    figure = f"{sent} image bytes sent; {proof}{first}outage {outage:.1f} s; up {back.seconds:.1f} s"
    figure += f", exit {back.returncode}"
    return f"{until:.1f}", figure
