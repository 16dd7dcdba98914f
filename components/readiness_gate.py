"""ReadinessGate: a dynamic resource whose create waits until the cluster answers a real request.

The provider ships `components/node_programs/readiness.py` to the head over SSH (`python3 -`, program
on stdin) and runs it there, so the probe sees the server the way a client on the head does. Dynamic
providers' create never runs during preview. `read` (pulumi refresh) probes once more with a short
deadline and reports the gate gone when the server no longer answers, so refresh shows that drift.

Pickled by reference to this module: keep the module importable with no side effects, and do not
rename `ReadinessGateProvider` (existing stacks refer to it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pulumi
import pulumi.dynamic as dynamic

from components.node_programs.readiness import API_KEY_ENV, EXIT_REJECTED, EXIT_TIMEOUT, PROGRESS_PREFIX
from components.nodes import target_from_dict
from components.progress import tell_operator
from components.remote import RemoteError, Result, require_ssh, ssh_argv, stderr_tail

PROBE_SOURCE = Path(__file__).resolve().parent / "node_programs" / "readiness.py"
# Extra seconds beyond the probe's own deadline: SSH, plus the probe's last round of docker
# calls (ray status, node list, inspect, logs: up to 60 s each) and its log tail.
TRANSPORT_SLACK_S = 300
# How long `pulumi refresh` waits for a server that answered before.
REFRESH_DEADLINE_S = 60
# Inputs whose change means "probe again" (everything but the secret and the node's access details).
_PROBE_KEYS = (
    "server_id",
    # Every container of the cluster: a Ray worker recreated behind a running server is a cluster
    # that has not answered since, so the gate probes again instead of still saying "ready".
    "container_ids",
    "url",
    "model",
    "expect_nodes",
    "expect_gpus",
    "expect_node_ips",
    "ray_container",
    "log_container",
)


def probe_argv(props: dict[str, Any], deadline_s: float) -> list[str]:
    """The command run on the head: the probe program arrives on stdin."""
    argv = [
        "python3", "-",
        "--url", str(props["url"]),
        "--model", str(props["model"]),
        "--nodes", str(int(props["expect_nodes"])),
        "--gpus", f"{float(props['expect_gpus']):g}",
        "--deadline", f"{float(deadline_s):g}",
    ]  # fmt: skip
    ray = props.get("ray_container")
    argv += ["--ray-container", ray] if ray else ["--no-ray-check"]
    if (props.get("node") or {}).get("name"):
        argv += ["--node", str(props["node"]["name"])]
    if props.get("log_container"):
        argv += ["--log-container", props["log_container"]]
    for name, ip in sorted((props.get("expect_node_ips") or {}).items()):
        argv += ["--expect-node", f"{name}={ip}"]
    return argv


def probe_program(api_key: str | None) -> bytes:
    """The probe's source, with the API key set in its environment (stdin, never argv)."""
    prelude = ""
    if api_key:
        prelude = f"import os\nos.environ[{API_KEY_ENV!r}] = {api_key!r}\n"
    return (prelude + PROBE_SOURCE.read_text()).encode()


def run_relaying(
    node: str,
    local_argv: Sequence[str],
    argv: Sequence[str],
    stdin: bytes,
    timeout: float,
    relay: Callable[[str], None],
) -> Result:
    """Run `local_argv` (ssh … argv) like the transport does, relaying progress lines as they come."""
    proc = subprocess.Popen(
        list(local_argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out: list[bytes] = []
    err: list[bytes] = []

    def feed() -> None:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except OSError:  # the remote side ended early: its exit status says why
            pass

    def pump() -> None:
        for raw in proc.stderr:
            err.append(raw)
            line = raw.decode(errors="replace").rstrip()
            if line.startswith(PROGRESS_PREFIX):
                relay(line)

    threads = [
        threading.Thread(target=feed, daemon=True),
        threading.Thread(target=pump, daemon=True),
        threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RemoteError(node, argv, -1, b"".join(err), f"timed out after {timeout:g} s") from None
    finally:
        for thread in threads:
            thread.join(timeout=5)
    return Result(tuple(argv), proc.returncode, b"".join(out), b"".join(err), node)


def rollback_hint(previous: dict[str, Any] | None, current: dict[str, Any] | None) -> str:
    """How to go back to what the gate last passed with: each setting that changed since, as the
    exact config line (empty when nothing it knows changed, or it never passed before)."""
    previous, current = previous or {}, current or {}
    lines = [
        f"{previous['lines'][key]} (now {current.get(key)})"
        for key in ("image", "revision")
        if previous.get(key)
        and previous.get(key) != current.get(key)
        and (previous.get("lines") or {}).get(key)
    ]
    if not lines:
        return ""
    return (
        "to go back to what served before, set "
        + "; ".join(lines)
        + " in the stack config and run `pulumi up` (the previous image is still on every node)"
    )


def run_probe(
    props: dict[str, Any], deadline_s: float, previous: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run the probe on the head; its report on success, RemoteError (with the log tail) if not.

    Its progress lines (the stage it waits on, at least every 30 s) reach the operator as they come.
    `previous`: what the gate last passed with (`deployed`), for the rollback hint of a failure.
    """
    target = target_from_dict(props["node"])
    require_ssh(target.label)
    argv = probe_argv(props, deadline_s)
    result = run_relaying(
        target.label,
        ssh_argv(target, argv, dial_with=sys.executable),
        argv,
        probe_program(props.get("api_key")),
        deadline_s + TRANSPORT_SLACK_S,
        lambda line: tell_operator(f"readiness on {target.label}: {line}"),
    )
    if result.ok:
        return json.loads(result.text.strip().splitlines()[-1])
    hints = {
        EXIT_TIMEOUT: "the server log tail is above; fix the cause, then `pulumi up` waits again",
        EXIT_REJECTED: "set qwen35-spark:api_key to the server's key",
    }
    # The probe's own message (stage, last error, 30 log lines) is the useful part: keep all of it.
    hint = "; ".join(
        h for h in (hints.get(result.returncode, ""), rollback_hint(previous, props.get("deployed"))) if h
    )
    raise GateFailed(props["node"]["name"], argv, result.returncode, result.stderr, hint)


class GateFailed(RemoteError):
    """The probe ran and said no; the message carries its whole report, not only the last lines."""

    def _message(self) -> str:
        if self.transport_failed:
            return super()._message()
        lines = [f"{self.node}: the deployment is not ready (probe exit {self.returncode})"]
        lines.append(stderr_tail(self.stderr, lines=60))
        if self.hint:
            lines.append(f"  next: {self.hint}")
        return "\n".join(lines)


class ReadinessGateProvider(dynamic.ResourceProvider):
    """create: wait until ready (deadline from config); read: probe once more; delete: nothing."""

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        report = run_probe(props, float(props["deadline_s"]))
        outs = {**props, "ready": True, "report": report}
        return dynamic.CreateResult(id_=f"{props['node']['name']}-{props['server_id']}"[:120], outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # What it probes changed: probe again, in place (update), so the probe still knows what the
        # gate last passed with (olds) and a failure can say how to go back. A new API key, deadline
        # or access details alone need no new probe.
        keys = (*_PROBE_KEYS, "api_key", "deadline_s", "node", "deployed")
        return dynamic.DiffResult(changes=any(olds.get(k) != news.get(k) for k in keys), replaces=[])

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        if not any(olds.get(k) != news.get(k) for k in _PROBE_KEYS):
            return dynamic.UpdateResult(outs={**olds, **news})
        # A failed probe leaves the state as it was: `deployed` stays what last served.
        report = run_probe(news, float(news["deadline_s"]), previous=olds.get("deployed"))
        return dynamic.UpdateResult(outs={**news, "ready": True, "report": report})

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        try:
            run_probe(props, min(REFRESH_DEADLINE_S, float(props.get("deadline_s") or REFRESH_DEADLINE_S)))
        except (RemoteError, ValueError):
            # Not serving any more: report the gate gone, so refresh shows it and `up` probes again.
            return dynamic.ReadResult(id_="", outs={})
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        # A gate leaves nothing on the node.
        return None


class ReadinessGate(dynamic.Resource, module="qwen35", name="ReadinessGate"):
    """Completes only once the server on the head has answered a real chat completion."""

    ready: pulumi.Output[bool]
    report: pulumi.Output[dict]

    def __init__(
        self,
        name: str,
        *,
        node: dict[str, Any],
        server_id: pulumi.Input[str],
        url: str,
        model: str,
        expect_nodes: int,
        expect_gpus: float,
        deadline_s: int,
        expect_node_ips: dict[str, str] | None = None,
        container_ids: dict[str, pulumi.Input[str]] | None = None,
        ray_container: str | None,
        log_container: str,
        api_key: pulumi.Input[str] | None,
        deployed: pulumi.Input[dict] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "node": node,
            "server_id": server_id,
            "url": url,
            "model": model,
            "expect_nodes": expect_nodes,
            "expect_gpus": expect_gpus,
            "expect_node_ips": expect_node_ips,
            "container_ids": container_ids,
            "deadline_s": deadline_s,
            "ray_container": ray_container,
            "log_container": log_container,
            "api_key": pulumi.Output.secret(api_key) if api_key is not None else None,
            # What this probe deploys (image, revision) and the config line that sets each.
            "deployed": deployed,
            "ready": None,
            "report": None,
        }
        opts = pulumi.ResourceOptions.merge(
            opts,
            pulumi.ResourceOptions(
                additional_secret_outputs=["api_key"],
                # Registered as the generic dynamic type before it had its own: not a replacement.
                aliases=[pulumi.Alias(type_="pulumi-python:dynamic:Resource")],
            ),
        )
        super().__init__(ReadinessGateProvider(), name, props, opts)
