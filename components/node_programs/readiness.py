"""Readiness probe: is the cluster really serving? Runs ON THE HEAD, standard library only.

Checks, in order, until a deadline: Ray reports every node and GPU; `/health` answers 200;
`/v1/models` lists the served model; one real chat completion returns tokens. On timeout it raises
(or exits 3) naming the stage that never passed, its last error, and the server's last log lines.

Shipped to the head on the stdin of `ssh head python3 - ARGS` (`node_programs.program_stdin`, with
the `wire` library; no install, no copy on the node); `python3 -m components.node_programs.readiness
ARGS` runs it locally. The API key comes from $QWEN35_API_KEY (`wire.PROBE_API_KEY_ENV`, set by the
program's prelude on stdin), never from argv. The Ray check runs `docker exec <head> ray status`:
it needs only the Ray CLI that is already in the head container, works before the dashboard is up,
and does not register a driver (a `ray.init` would); the dashboard stays closed to everything off
the fabric network.

(No `from __future__` import here: it may run after a prelude, see `node_programs.program_stdin`.)
"""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import IntEnum

from components.node_programs import cold_start
from components.node_programs.wire import PROBE_API_KEY_ENV, PROBE_PROGRESS_PREFIX, PROGRESS_DIR

LOG_TAIL_LINES = 30
# A wait that stays at one stage still says so this often (a 120 GB load takes many minutes).
REPORT_EVERY_S = 30.0


class Exit(IntEnum):
    OK = 0
    TIMEOUT = 3  # a stage never passed before the deadline (named on stderr)
    REJECTED = 4  # the server refused the API key


PROMPT = "Reply with the single word: ready"

_NODE_LINE = re.compile(r"^\s*(\d+)\s+\S+")
_GPU_LINE = re.compile(r"([0-9.]+)\s*/\s*([0-9.]+)\s+GPU\b")


class NotReady(Exception):
    """One stage has not passed yet (worth retrying until the deadline)."""

    def __init__(self, stage: str, detail: str):
        self.stage = stage
        self.detail = detail
        super().__init__(f"{stage}: {detail}")


class ReadinessError(RuntimeError):
    """The server will not become ready: the deadline passed, or it rejected us outright."""

    def __init__(self, message: str, stage: str, log_tail: str = "", rejected: bool = False):
        self.stage = stage
        self.log_tail = log_tail
        self.rejected = rejected
        if log_tail:
            message += f"\n  last {LOG_TAIL_LINES} lines of the server log:\n" + _indent(log_tail)
        super().__init__(message)


@dataclass(frozen=True)
class RayStatus:
    nodes: int
    gpus: float


@dataclass(frozen=True)
class ReadyReport:
    """What the probe saw when everything passed."""

    ray_nodes: int
    ray_gpus: float
    model: str
    completion_tokens: int
    reply: str
    elapsed_s: float


def parse_ray_status(text: str) -> RayStatus:
    """Alive nodes and total GPUs from `ray status` (nodes are listed under Active: and Idle:)."""
    nodes = 0
    section = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":") and not line.startswith(" "):
            section = stripped[:-1]
            continue
        if section in ("Active", "Idle"):
            match = _NODE_LINE.match(line)
            if match:
                nodes += int(match.group(1))
    gpu = _GPU_LINE.search(text)
    return RayStatus(nodes=nodes, gpus=float(gpu.group(2)) if gpu else 0.0)


def _request(url: str, api_key: str | None, body: dict | None, timeout: float) -> tuple[int, bytes]:
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise NotReady("connect", f"{url}: {reason}") from None


def _json(stage: str, payload: bytes) -> dict:
    try:
        value = json.loads(payload)
    except ValueError:
        raise NotReady(stage, f"answer is not JSON: {payload[:120]!r}") from None
    if not isinstance(value, dict):
        raise NotReady(stage, f"answer is not a JSON object: {payload[:120]!r}")
    return value


def _rejected(stage: str, status: int) -> None:
    if status in (401, 403):
        raise ReadinessError(
            f"readiness: {stage}: the server answered {status}: the API key does not match the "
            "server's (set `qwen35-spark:api_key` to the key the server was started with)",
            stage,
            rejected=True,
        )


def check_ray(
    ray_status: Callable[[], str],
    expect_nodes: int,
    expect_gpus: float,
    ray_nodes: Callable[[], str] | None = None,
    expected_ips: dict[str, str] | None = None,
) -> RayStatus:
    try:
        status = parse_ray_status(ray_status())
    except (OSError, subprocess.SubprocessError) as exc:
        raise NotReady("ray", f"`ray status` failed: {exc}") from None
    if status.nodes < expect_nodes or status.gpus < expect_gpus:
        detail = f"{status.nodes}/{expect_nodes} nodes, {status.gpus:g}/{expect_gpus:g} GPUs joined"
        raise NotReady("ray", detail + _missing_nodes(ray_nodes, expected_ips))
    return status


def parse_alive_ips(text: str) -> set[str]:
    """Addresses of the ALIVE nodes in `ray list nodes --format json`."""
    nodes = json.loads(text)
    return {str(n.get("node_ip")) for n in nodes if isinstance(n, dict) and n.get("state") == "ALIVE"}


def _missing_nodes(ray_nodes: Callable[[], str] | None, expected_ips: dict[str, str] | None) -> str:
    """`; not joined: spark-2 (192.168.200.13)`, or "" when Ray cannot say which (older Ray, no dashboard)."""
    if not ray_nodes or not expected_ips:
        return ""
    try:
        alive = parse_alive_ips(ray_nodes())
    except (OSError, subprocess.SubprocessError, ValueError):
        return ""
    missing = [f"{name} ({ip})" for name, ip in sorted(expected_ips.items()) if ip not in alive]
    return f"; not joined: {', '.join(missing)}" if missing else ""


def check_server_alive(server_state: Callable[[], str] | None) -> None:
    """Give up at once when the server container has exited (no restart is coming)."""
    if server_state is None:
        return
    try:
        state = server_state().split()
    except (OSError, subprocess.SubprocessError):
        return
    if state and state[0] in ("exited", "dead"):
        code = state[1] if len(state) > 1 else "?"
        raise ReadinessError(
            f"readiness: the server container has {state[0]} (exit code {code}) and will not restart\n"
            "  next: read the server log below, fix the cause, then `pulumi up` starts it again",
            "server",
        )


def check_health(base: str, timeout: float) -> None:
    status, body = _request(f"{base}/health", None, None, timeout)
    if status != 200:
        raise NotReady("health", f"/health answered {status}: {body[:200]!r}")


def check_models(base: str, model: str, api_key: str | None, timeout: float) -> None:
    status, body = _request(f"{base}/v1/models", api_key, None, timeout)
    _rejected("models", status)
    if status != 200:
        raise NotReady("models", f"/v1/models answered {status}: {body[:200]!r}")
    ids = [str(m.get("id")) for m in _json("models", body).get("data", []) if isinstance(m, dict)]
    if model not in ids:
        raise NotReady("models", f"{model!r} not among served models {ids}")


def check_completion(base: str, model: str, api_key: str | None, timeout: float) -> tuple[int, str]:
    """One real chat completion; returns (completion tokens, reply text)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 16,
        "temperature": 0,
    }
    status, raw = _request(f"{base}/v1/chat/completions", api_key, body, timeout)
    _rejected("completion", status)
    if status != 200:
        raise NotReady("completion", f"/v1/chat/completions answered {status}: {raw[:200]!r}")
    answer = _json("completion", raw)
    choices = answer.get("choices") or [{}]
    message = choices[0].get("message") or {}
    # Reasoning models may spend a short budget thinking: that is still generated tokens.
    text = message.get("content") or message.get("reasoning_content") or ""
    tokens = int((answer.get("usage") or {}).get("completion_tokens") or 0)
    if tokens <= 0 and not text:
        raise NotReady("completion", f"the completion returned no tokens: {raw[:200]!r}")
    return tokens, text


def ready_report(ray: RayStatus | None, model: str, tokens: int, reply: str, elapsed_s: float) -> ReadyReport:
    """What the probe saw once every stage passed (Ray's counts are 0 when its check was skipped)."""
    return ReadyReport(
        ray_nodes=ray.nodes if ray else 0,
        ray_gpus=ray.gpus if ray else 0.0,
        model=model,
        completion_tokens=tokens,
        reply=reply[:200],
        elapsed_s=round(elapsed_s, 1),
    )


def check_endpoints(base: str, model: str, api_key: str | None, remaining: float) -> None:
    """The server's stages before a completion: `/health` answers 200, `/v1/models` lists `model`."""
    check_health(base, min(remaining, 30.0))
    check_models(base, model, api_key, min(remaining, 30.0))


class StageReports:
    """Says which stage the wait is at: when the stage changes, and every `every_s` while it does not."""

    def __init__(self, progress: Callable[[str], None] | None, start: float, every_s: float):
        self.progress = progress
        self.start = start
        self.every_s = every_s
        self.stage = ""
        self.said_at = start

    def note(self, waiting: NotReady, now: float) -> None:
        if self.progress and (waiting.stage != self.stage or now - self.said_at >= self.every_s):
            at = f"{now - self.start:.0f} s at stage '{waiting.stage}'"
            self.progress(f"{PROBE_PROGRESS_PREFIX}{at}: {waiting.detail}")
            self.stage, self.said_at = waiting.stage, now


def stop_if_exited(
    server_state: Callable[[], str] | None, waiting: NotReady, log_tail: Callable[[], str] | None
) -> None:
    """Give up at once when the server container has exited, saying which stage the wait was at."""
    try:
        check_server_alive(server_state)
    except ReadinessError as exited:
        message = f"{exited.args[0]}\n  it was waiting at stage '{waiting.stage}': {waiting.detail}"
        raise ReadinessError(message, exited.stage, _tail(log_tail)) from None


def timed_out(deadline_s: float, base: str, last: NotReady, tail: str) -> ReadinessError:
    """The error of a wait whose deadline passed: the stage that never passed and the server's log."""
    message = (
        f"readiness: not ready after {deadline_s:g} s at {base}\n"
        f"  stuck at stage '{last.stage}': {last.detail}\n"
        "  next: look at the server log below; `pulumi up` again resumes waiting"
    )
    return ReadinessError(message, last.stage, tail)


def wait_ready(
    probe_target: str,
    expect_nodes: int,
    expect_gpus: float,
    model: str,
    deadline_s: float,
    api_key: str | None = None,
    *,
    ray_check: Callable[[], str] | None,
    log_tail: Callable[[], str] | None = None,
    ray_nodes: Callable[[], str] | None = None,
    expected_ips: dict[str, str] | None = None,
    server_state: Callable[[], str] | None = None,
    interval_s: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] | None = None,
    report_every_s: float = REPORT_EVERY_S,
) -> ReadyReport:
    """Poll every stage until all pass or `deadline_s` passes (then raise ReadinessError).

    `ray_check` returns `ray status` output; pass None explicitly to skip Ray (stand-in servers).
    `log_tail` returns the server's last log lines for the timeout message. `ray_nodes` returns
    `ray list nodes --format json`, to name the nodes of `expected_ips` (name -> address) that have
    not joined; `server_state` returns the container's "status exit-code", to stop early on exit.
    `progress` gets `waiting <s> s at stage '<stage>': <detail>` when the stage changes and at least
    every `report_every_s` while it does not.
    """
    base = probe_target.rstrip("/")
    start = clock()
    end = start + deadline_s
    last = NotReady("start", "not probed yet")
    reports = StageReports(progress, start, report_every_s)
    while True:
        remaining = max(end - clock(), 1.0)
        try:
            ray = (
                check_ray(ray_check, expect_nodes, expect_gpus, ray_nodes, expected_ips)
                if ray_check
                else None
            )
            check_endpoints(base, model, api_key, remaining)
            tokens, reply = check_completion(base, model, api_key, min(remaining, 300.0))
            return ready_report(ray, model, tokens, reply, clock() - start)
        except NotReady as exc:
            last = exc
            reports.note(exc, clock())
            stop_if_exited(server_state, exc, log_tail)
        except ReadinessError as exc:
            raise ReadinessError(exc.args[0], exc.stage, _tail(log_tail), exc.rejected) from None
        if clock() + interval_s > end:
            break
        sleep(interval_s)
    raise timed_out(deadline_s, base, last, _tail(log_tail))


def _tail(log_tail: Callable[[], str] | None) -> str:
    if log_tail is None:
        return ""
    try:
        return log_tail().rstrip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(could not read the server log: {exc})"


def _indent(text: str) -> str:
    return "\n".join("    | " + line for line in text.splitlines())


def _docker(argv: list[str], timeout: float = 60.0) -> str:
    """stdout+stderr of a docker command on this node (`docker logs` writes to both)."""
    done = subprocess.run(
        ["docker", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False
    )
    text = done.stdout.decode(errors="replace")
    if done.returncode != 0:
        raise OSError(f"docker {' '.join(argv[:2])} exited {done.returncode}: {text.strip()[-300:]}")
    return text


# A start's milestones fall within the longest wait a gate gives (serve.ready_timeout, at most 6 h):
# the log after that is never read.
START_WINDOW_S = 6 * 3600 + 60


def milestone_lines(container: str, started_at: str, timeout: float = 60.0) -> list[str]:
    """The server's log lines of its start's window (`docker logs --timestamps --since --until`)
    that mark a cold-start milestone, read as a stream that keeps only those lines."""
    started = cold_start.parse_stamp(started_at)
    if started is None:
        return []
    until = f"{started + START_WINDOW_S:.3f}"
    argv = ["docker", "logs", "--timestamps", "--since", started_at, "--until", until, container]
    kept: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                if any(mark.search(line) for mark in cold_start.MARKS):
                    kept.append(line)
        finally:
            timer.cancel()
    if proc.returncode != 0:
        raise OSError(f"docker logs exited {proc.returncode}")
    return kept


def start_record(container: str, waited_from: float, completion_at: float) -> dict:
    """This server start's cold-start record (`cold_start.cold_start`): its container's start, vLLM's
    milestones from its log, and this completion as the first when the wait began before the API
    was ready; {"error": why} when Docker could not say."""
    try:
        started = _docker(["inspect", "--format", "{{.State.StartedAt}}", container]).strip()
        record = cold_start.cold_start(
            started, milestone_lines(container, started), completion_at, waited_from
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return record if record is not None else {"error": f"no start time for {container}: {started!r}"}


class ProgressFile:
    """This wait's stage on stderr (the gate relays it) and in `~/.qwen35/progress/<operation>.json`.

    The file has the fields every long operation writes (byte fields are None for a wait), so
    `status` shows a wait in flight beside copies and fetches. Failing to write it never fails the wait.
    """

    def __init__(self, operation: str, node: str, folder: str = PROGRESS_DIR):
        self.path = os.path.join(os.path.expanduser(folder), f"{operation}.json")
        self.record = {
            "operation": operation,
            "node": node,
            "peer": None,
            "stage": "starting",
            "bytes_done": None,
            "bytes_total": None,
            "rate_bps": None,
            "eta_s": None,
            "started_at": time.time(),
            "updated_at": time.time(),
            "pid": os.getpid(),
        }

    def report(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        self.record.update(stage=line, updated_at=time.time())
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path + ".tmp", "w") as handle:
                json.dump(self.record, handle)
            os.replace(self.path + ".tmp", self.path)
        except OSError:
            pass

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.remove(self.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="readiness", description="Wait until the cluster serves.")
    parser.add_argument("--url", required=True, help="server base URL as seen from here")
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--nodes", type=int, required=True, help="Ray nodes expected")
    parser.add_argument("--gpus", type=float, required=True, help="Ray GPUs expected")
    parser.add_argument("--deadline", type=float, required=True, help="seconds before giving up")
    parser.add_argument("--interval", type=float, default=5.0)
    ray = parser.add_mutually_exclusive_group(required=True)
    ray.add_argument("--ray-container", help="Ray head container (runs `ray status` in it)")
    ray.add_argument("--no-ray-check", action="store_true", help="skip Ray (executor mp: no Ray runs)")
    parser.add_argument("--log-container", help="container whose log tail explains a timeout")
    parser.add_argument(
        "--expect-node", action="append", default=[], metavar="NAME=IP", help="a node Ray must report"
    )
    parser.add_argument("--node", default="", help="this node's name (for the progress file)")
    args = parser.parse_args(argv)
    expected_ips = dict(item.split("=", 1) for item in args.expect_node)

    ray_check = ray_nodes = server_state = None
    if args.ray_container:
        container = args.ray_container
        ray_check = lambda: _docker(["exec", container, "ray", "status"])  # noqa: E731
        ray_nodes = lambda: _docker(["exec", container, "ray", "list", "nodes", "--format", "json"])  # noqa: E731
    log_tail = None
    if args.log_container:
        logs = args.log_container
        log_tail = lambda: _docker(["logs", "--tail", str(LOG_TAIL_LINES), logs])  # noqa: E731
        state_format = "{{.State.Status}} {{.State.ExitCode}}"
        server_state = lambda: _docker(["inspect", "--format", state_format, logs])  # noqa: E731
    progress_file = ProgressFile("readiness", args.node)
    waited_from = time.time()
    try:
        report = wait_ready(
            args.url,
            args.nodes,
            args.gpus,
            args.model,
            args.deadline,
            os.environ.get(PROBE_API_KEY_ENV) or None,
            ray_check=ray_check,
            log_tail=log_tail,
            ray_nodes=ray_nodes,
            expected_ips=expected_ips,
            server_state=server_state,
            interval_s=args.interval,
            progress=progress_file.report,
        )
    except ReadinessError as exc:
        print(str(exc), file=sys.stderr)
        return Exit.REJECTED if exc.rejected else Exit.TIMEOUT
    finally:
        progress_file.remove()
    out = asdict(report)
    if args.log_container:
        out["cold_start"] = start_record(args.log_container, waited_from, time.time())
    print(json.dumps(out))
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
