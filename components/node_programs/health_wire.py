"""What the watchdog, its agents and the Pulumi program agree on, declared once (a library, standard
library only: `program_argv` ships it with `watchdog` and `health_agent`; the program imports it too).

The watchdog (on the head) probes the server and decides; an agent on every other node acts only on
its own node's containers of this stack, and only for a request signed with the stack's secret:

    X-Qwen35-Time: <unix seconds>
    X-Qwen35-Nonce: <32 hex digits, new for every request>
    X-Qwen35-Signature: hex HMAC-SHA256(secret, METHOD \\n PATH \\n TIME \\n NONCE \\n NODE \\n BODY)

NODE is the agent's node: a request signed for one node is refused by every other. The container
acted on is in the BODY ({"name": …}), signed too. An absent or wrong signature, a time more than
SIGNATURE_WINDOW_S away from the agent's clock, or a nonce the agent has seen within that window (a
replay) is refused with 401 and counted (`qwen35_health_agent_refusals_total`); nothing else happens.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable

from components.node_programs import engine_api

# ---- environment and paths ---------------------------------------------------------------------------

CONFIG_ENV = "QWEN35_HEALTH_CONFIG"  # the non-secret JSON config (`components.health.containers`)
SECRET_ENV = "QWEN35_HEALTH_SECRET"  # the per-stack secret that signs every request to an agent
# Where the deployment puts that secret in each health container: a file written into the container
# at its creation (pulumi-docker `uploads`), never its environment. `docker inspect` shows a
# container's environment, and the Docker provider logs its inspect as a debug event, where the
# engine masks only config secrets: a generated secret in the environment would reach `up --json`.
# SECRET_ENV remains for a program run by hand (or a test) without the file.
SECRET_FILE = "/run/qwen35-health/secret"


def read_secret(path: str = SECRET_FILE) -> str:
    """The per-stack secret: SECRET_FILE's content when the file exists, else SECRET_ENV ("": none)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return os.environ.get(SECRET_ENV, "")
    except OSError:  # unreadable (another user in the image): no secret, said by the caller
        return ""


API_KEY_ENV = "QWEN35_HEALTH_API_KEY"  # vLLM's API key for the completion probe (optional)
MEMINFO_ENV = "QWEN35_MEMINFO"  # where MemAvailable is read (lab: a crafted file)
DEFAULT_MEMINFO = "/proc/meminfo"
STATE_DIR = "/var/lib/qwen35-health"  # the watchdog's state volume: the budget survives its container
STATE_FILE = "state.json"
MEMINFO_MOUNT = "/run/qwen35-health/meminfo"  # lab only: where a crafted meminfo is mounted
KERNEL_LOG_ENV = "QWEN35_KERNEL_LOG"  # where the kernel's log is read (a test: a crafted file)
DEFAULT_KERNEL_LOG = "/dev/kmsg"
DOCKER_SOCKET_MOUNT = "/var/run/docker.sock"  # where the node's Docker socket is mounted inside

# ---- HTTP --------------------------------------------------------------------------------------------

METRICS_PATH = "/metrics"  # Prometheus text, unsigned (watchdog and agents)
STATE_PATH = "/state"  # the watchdog's state as JSON, unsigned (read by `status`)
# The agent's signed endpoints: POST with a JSON body ({"name": container} where one is acted on).
AGENT_MEMINFO = "/meminfo"  # {"available_bytes": int | None, "error": str | None}
AGENT_CONTAINERS = "/containers"  # {"containers": [{name, state, exit_code, started_at, restarts}]}
AGENT_STOP = "/stop"
AGENT_START = "/start"
AGENT_RESTART = "/restart"
AGENT_LOGS = "/logs"  # {"name", "tail"} -> {"lines": [...]}
AGENT_KERNEL = "/kernel"  # {} -> {"faults": [...], "error": str | None}: the kernel's OOM kills and Xids
# {"name"} -> gpu_memory.run_probe beside that container: {"report", "error", "took_s"}
AGENT_MEMORY_PROBE = "/memory_probe"
# {"since", "until"} (unix seconds, the agent's clock) -> {"events": [...], "error": str | None}: Docker's
# events of this node's serving containers in that window (`events`)
AGENT_EVENTS = "/events"
AGENT_ACTIONS = (AGENT_STOP, AGENT_START, AGENT_RESTART)
TIME_HEADER = "X-Qwen35-Time"
NONCE_HEADER = "X-Qwen35-Nonce"
SIGNATURE_HEADER = "X-Qwen35-Signature"
SIGNATURE_WINDOW_S = 60
NONCE_HEX = 32  # a nonce's length in hex digits (128 random bits)

# ---- /state ------------------------------------------------------------------------------------------


class State(str, enum.Enum):
    """The watchdog's verdict, /state's `state`."""

    STARTING = "starting"  # no verdict yet: the server has not been ready, and startup_s has not passed
    HEALTHY = "healthy"
    FAILING = "failing"  # probes fail, fewer than `failures` in a row (or report mode: it would act)
    RECOVERING = "recovering"  # a recovery step runs (`step`)
    BUDGET_SPENT = "budget_spent"  # everything stopped; waits for an operator (`spent`)
    MEMORY_HELD = "memory_held"  # a restart blocked: a node's MemAvailable stayed below the need (`held`)


class Step(str, enum.Enum):
    """A recovery's step, /state's `step`."""

    DIAGNOSE = "diagnose"
    MEMORY_WAIT = "memory_wait"  # containers stopped; waiting for MemAvailable to reach the need
    RESTART_SERVER = "restart_server"  # the server restarted; waiting for ready within ready_s
    RESTART_CLUSTER = "restart_cluster"  # every container restarted; waiting for ready within ready_s


STATE_KEYS = (
    "state",
    "mode",
    "step",
    "since",
    "last_ready",
    "consecutive_failures",
    "restarts",
    "restarts_total",
    "budget_left",
    "spent",
    "held",
    "budget_resets",
    "last_diagnosis",
    "would",
    "next_step",
    "consecutive_completion_failures",
    "progress",
    "hang_bound_s",
    "agent_clock_skew_s",
    "clock_skew",
    "memory_guard",
    "cold_start",
    "docker_events",
    "standing_back",
    "stand_backs",
    "stand_backs_total",
)


class Mode(str, enum.Enum):
    ENFORCE = "enforce"
    REPORT = "report"  # watch and record what it would do, never act
    OFF = "off"


class Exit(enum.IntEnum):
    """Exit codes of `watchdog` and `health_agent` (a running one never exits on its own)."""

    OK = 0
    BAD_CONFIG = 2  # QWEN35_HEALTH_CONFIG missing or not the expected JSON
    NO_SECRET = 3  # QWEN35_HEALTH_SECRET missing: an agent would accept anyone, a watchdog be refused
    MODE_OFF = 4  # the config says mode off: nothing to run
    CANNOT_LISTEN = 5  # the address is taken or not this node's


# ---- signing -----------------------------------------------------------------------------------------


def signature(secret: str, method: str, path: str, stamp: str, nonce: str, node: str, body: bytes) -> str:
    """The request's HMAC-SHA256 (hex) under the stack's secret, bound to its time, nonce and node."""
    message = f"{method.upper()}\n{path}\n{stamp}\n{nonce}\n{node}\n".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signed_headers(
    secret: str, method: str, path: str, body: bytes, now: float, *, node: str, nonce: str | None = None
) -> dict[str, str]:
    """The headers that sign one request to `node`'s agent (a new nonce unless one is given)."""
    stamp, nonce = str(int(now)), nonce or secrets.token_hex(NONCE_HEX // 2)
    return {
        TIME_HEADER: stamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: signature(secret, method, path, stamp, nonce, node, body),
    }


def check_signature(
    secret: str, method: str, path: str, body: bytes, headers: dict[str, str], now: float, node: str
) -> str | None:
    """Why a request to `node`'s agent is refused (absent or wrong signature, one signed for another
    node, a stale time), or None when it is signed. `headers`: lower-case names. Replays: the caller."""
    stamp, nonce = headers.get(TIME_HEADER.lower()), headers.get(NONCE_HEADER.lower())
    given = headers.get(SIGNATURE_HEADER.lower())
    if not stamp or not given or not nonce:
        return "no signature"
    try:
        skew = now - int(stamp)
    except ValueError:
        return "a time that is not a number"
    if abs(skew) > SIGNATURE_WINDOW_S:
        return (
            f"a time {abs(skew):.0f} s from this node's clock (more than {SIGNATURE_WINDOW_S} s): "
            f"this node's clock is {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the caller's"
        )
    if len(nonce) != NONCE_HEX or any(ch not in "0123456789abcdef" for ch in nonce):
        return "a nonce that is not 32 lower-case hex digits"
    if not hmac.compare_digest(signature(secret, method, path, stamp, nonce, node, body), given):
        return "a wrong signature (or one for another node)"
    return None


def skew_message(node: str, skew_s: float) -> str:
    """What the watchdog says of an agent whose clock is too far from the head's."""
    way = "ahead of" if skew_s > 0 else "behind"
    return (
        f"{node}'s clock is {abs(skew_s):.0f} s {way} the head's, beyond the agents' "
        f"{SIGNATURE_WINDOW_S} s window: its agent refuses every request; synchronise the clocks "
        "(chrony or systemd-timesyncd on both nodes)"
    )


# ---- memory ------------------------------------------------------------------------------------------


def mem_available(text: str) -> int | None:
    """MemAvailable in bytes from /proc/meminfo's text, or None when it has no such line."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "MemAvailable":
            parts = value.split()
            if parts and parts[0].isdigit():
                # The kernel always says kB (KiB); a crafted file may too.
                return int(parts[0]) * (1024 if parts[1:2] in (["kB"], []) else 1)
    return None


def read_mem_available(path: str) -> tuple[int | None, str | None]:
    """(MemAvailable bytes, None) from the meminfo at `path`, or (None, why not)."""
    try:
        with open(path) as handle:
            found = mem_available(handle.read())
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror or exc}"
    return (found, None) if found is not None else (None, f"{path} has no MemAvailable line")


def gb(value: int | float) -> str:
    """Bytes as whole GB (10^9), the unit of the memory fit."""
    return f"{value / 1e9:.0f} GB"


def held_message(node: str, available: int, need: int) -> str:
    """What the watchdog says when a node's memory blocks a restart (eugr #257's leak)."""
    return f"{node}: MemAvailable {gb(available)}, {gb(need)} needed: unified memory is held; reboot {node}"


# ---- the memory guard --------------------------------------------------------------------------------

GUARD_PERIOD_S = 1.0  # how often each node's guard reads MemAvailable (a file read: cheap)


def gb1(value: int | float) -> str:
    """Bytes as GB (10^9) with one decimal: the guard's floor is a few GB, whole GB would hide it."""
    return f"{value / 1e9:.1f} GB"


# A container's exit status when Docker's stop ended it with SIGKILL (128 + 9) after its grace.
SIGKILL_EXIT = 137


def guard_stopped(done: dict, inspected: dict, stop_s: int) -> dict:
    """A guard's stop as recorded: the stop's own {ok, error}, its bound (`stop_s`: SIGTERM, then
    SIGKILL), and how the container ended (`exit_code`; `killed`: it was still running after `stop_s`
    and SIGKILL ended it, or the kernel's OOM killer did: both exit 137)."""
    code = inspected.get("exit_code") if inspected.get("state") in ("exited", "dead") else None
    return {
        **done,
        "stop_s": stop_s,
        "exit_code": code,
        "killed": None if code is None else code == SIGKILL_EXIT,
    }


def guard_stop_said(done: dict) -> str:
    """One stop in words: `SIGTERM, exit 0 within 10 s`, `SIGKILL after 10 s (exit 137)`, the error."""
    if not done.get("ok"):
        return f"failed: {done.get('error')}"
    if done.get("killed"):
        return f"SIGKILL after {done.get('stop_s')} s (exit {done.get('exit_code')})"
    if done.get("exit_code") is None:
        return f"stopped (SIGTERM, then SIGKILL after {done.get('stop_s')} s; exit status not read)"
    return f"SIGTERM, exit {done.get('exit_code')} within {done.get('stop_s')} s"


class MemoryGuard:
    """One node's guard (issue 41 item 6): MemAvailable below `floor_bytes` for `floor_s` stops this
    stack's serving containers that run on the node, once, before the kernel's OOM killer or a hung
    unified-memory node does; under report it records what it would stop. It re-arms when
    MemAvailable is back above the floor. The watchdog sees each trip (`trips`, `last`) and answers it
    with a world restart within its budget. The node's MemAvailable, its running containers and the
    stop are given: tests drive it with a fake clock."""

    def __init__(
        self,
        node: str,
        floor_bytes: int | None,
        floor_s: float,
        enforce: bool,
        read: Callable[[], tuple[int | None, str | None]],
        running: Callable[[], list[str]],
        stop: Callable[[str], dict],
    ):
        self.node, self.floor_bytes, self.floor_s, self.enforce = node, floor_bytes, floor_s, enforce
        self.read, self.running, self.stop = read, running, stop
        self.below_since: float | None = None
        self.armed = True
        self.trips = 0
        self.last: dict | None = None
        self.available: int | None = None
        self.lock = threading.Lock()

    def check(self, now: float) -> dict | None:
        """One reading; the trip's record when the guard trips now, else None. A check while another
        runs (the periodic thread and the watchdog's tick) returns at once."""
        if not self.floor_bytes or not self.lock.acquire(blocking=False):
            return None
        try:
            return self._check(now)
        finally:
            self.lock.release()

    def _check(self, now: float) -> dict | None:
        available, _ = self.read()
        self.available = available
        if available is None or available >= self.floor_bytes:
            self.below_since = None
            self.armed = self.armed or available is not None
            return None
        self.below_since = now if self.below_since is None else self.below_since
        if not self.armed or now - self.below_since < self.floor_s:
            return None
        names = self.running()
        if not names:  # nothing of this stack runs here: nothing to stop, and nothing spent
            return None
        self.armed = False
        errors, stops = {}, {}
        for name in names if self.enforce else ():
            done = self.stop(name)
            stops[name] = {k: done.get(k) for k in ("stop_s", "exit_code", "killed")}
            if not done.get("ok"):
                errors[name] = done.get("error")
        self.trips += 1
        self.last = self._record(now, available, names, errors, stops)
        return self.last

    def _record(self, now: float, available: int, names: list[str], errors: dict, stops: dict) -> dict:
        below = now - (self.below_since or now)
        done = "stopped" if self.enforce else "report mode: would stop"
        message = (
            f"{self.node}: MemAvailable {gb1(available)} below the memory floor "
            f"{gb1(self.floor_bytes or 0)} for {below:.0f} s: {done} {', '.join(names)} before the "
            "kernel's OOM killer or a hang"
        )
        killed = [name for name, stop in stops.items() if stop.get("killed")]
        if killed:
            message += f" ({', '.join(killed)} SIGKILLed after {stops[killed[0]].get('stop_s')} s)"
        return {
            "node": self.node,
            "at": now,
            "available_bytes": available,
            "floor_bytes": self.floor_bytes,
            "below_s": below,
            "acted": self.enforce,
            "stopped": names,
            # Per container stopped: the bound (SIGTERM, then SIGKILL), its exit status, SIGKILL or not.
            "stops": stops,
            "errors": errors,
            "message": message,
        }

    def report(self) -> dict:
        """What the watchdog reads: trips so far, the last one, and the figures now."""
        return {
            "trips": self.trips,
            "last": self.last,
            "floor_bytes": self.floor_bytes,
            "available_bytes": self.available,
            "below_since": self.below_since,
        }


def guard_thread(guard: MemoryGuard, log: Callable[[str], None]) -> threading.Thread | None:
    """Check `guard` every GUARD_PERIOD_S in a thread of its own: a tick that waits on a completion's
    deadline must not delay it. None when the guard is off."""
    if not guard.floor_bytes:
        return None

    def run() -> None:
        while True:
            try:
                guard.check(time.time())
            except Exception as exc:  # a failed check is logged and the next one runs: never exit
                log(f"memory guard check failed: {type(exc).__name__}: {exc}")
            time.sleep(GUARD_PERIOD_S)

    thread = threading.Thread(target=run, name="memory-guard", daemon=True)
    thread.start()
    return thread


# ---- the kernel's log: OOM kills and NVRM Xids (what a diagnosis names) -------------------------------

KERNEL_LOG_LIMIT = 1 << 20  # bytes of the kernel's log read at most
KERNEL_RECORDS_LIMIT = 20_000  # /dev/kmsg records read at most (one a read)
KERNEL_FAULTS_KEPT = 10  # the newest faults kept in a diagnosis
# A record's prefix: /dev/kmsg's `prio,seq,usec,flags[,…];` or dmesg's `[  123.456789] `.
_KMSG = re.compile(r"^\d+,\d+,(?P<usec>\d+),[^;]*;(?P<text>.*)$")
_DMESG = re.compile(r"^\[\s*(?P<sec>\d+\.\d+)\]\s?(?P<text>.*)$")
_OOM = re.compile(
    r"(?P<scope>Memory cgroup out of memory|Out of memory(?: \(oom_kill_allocating_task\))?): "
    r"Killed process (?P<pid>\d+) \((?P<process>[^)]*)\)(?:.*?anon-rss:(?P<anon_kb>\d+)kB)?"
)
_OOM_TASK = re.compile(r"oom-kill:.*?task_memcg=(?P<memcg>[^,]*),task=(?P<process>[^,]*),pid=(?P<pid>\d+)")
_XID = re.compile(
    r"NVRM: Xid \((?P<device>[^)]*)\): (?P<xid>\d+), (?:pid=(?P<pid>'?[^,]*?'?), )?"
    r"(?:name=(?P<process>[^,]*), )?(?P<text>.*)$"
)
# What the Xids a serving GPU meets most mean (NVIDIA's Xid catalogue), for a person reading `status`.
XID_MEANING = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def kernel_record(line: str) -> tuple[float | None, str]:
    """(seconds since boot or None, the message) of one /dev/kmsg record or one dmesg line."""
    found = _KMSG.match(line)
    if found:
        return int(found["usec"]) / 1e6, found["text"]
    found = _DMESG.match(line)
    if found:
        return float(found["sec"]), found["text"]
    return None, line


def kernel_fault(line: str) -> dict | None:
    """One kernel log line as a fault ({kind: oom_kill | xid, uptime_s, pid, process, …}) or None."""
    uptime, text = kernel_record(line.rstrip("\n"))
    found = _OOM.search(text)
    if found:
        fault = {
            "kind": "oom_kill",
            "uptime_s": uptime,
            "pid": int(found["pid"]),
            "process": found["process"],
        }
        fault["scope"] = "cgroup" if found["scope"].startswith("Memory cgroup") else "node"
        if found["anon_kb"]:
            fault["anon_rss_bytes"] = int(found["anon_kb"]) * 1024
        return fault
    found = _OOM_TASK.search(text)
    if found:
        return {"kind": "oom_task", "uptime_s": uptime, "pid": int(found["pid"]), "process": found["process"],
                "memcg": found["memcg"]}  # fmt: skip
    found = _XID.search(text)
    if found:
        xid, pid = int(found["xid"]), (found["pid"] or "").strip("'")
        return {
            "kind": "xid",
            "uptime_s": uptime,
            "xid": xid,
            "device": found["device"],
            "pid": int(pid) if pid.isdigit() else None,
            "process": found["process"],
            "meaning": XID_MEANING.get(xid, "see NVIDIA's Xid catalogue"),
            "text": found["text"].strip()[:200],
        }
    return None


def kernel_faults(text: str, keep: int = KERNEL_FAULTS_KEPT) -> list[dict]:
    """The newest `keep` OOM kills and Xids in a kernel log's text. An `oom-kill:` line (which names the
    killed task's memory cgroup: its container) is merged into the `Killed process` line of its pid."""
    faults: list[dict] = []
    tasks: dict[int, dict] = {}
    for line in text.splitlines():
        fault = kernel_fault(line)
        if fault is None:
            continue
        if fault["kind"] == "oom_task":
            tasks[fault["pid"]] = fault
            continue
        if fault["kind"] == "oom_kill" and fault["pid"] in tasks:
            fault["memcg"] = tasks.pop(fault["pid"])["memcg"]
        faults.append(fault)
    return faults[-keep:]


def read_kernel_log(path: str, limit: int = KERNEL_LOG_LIMIT) -> tuple[str | None, str | None]:
    """(text, None) of the kernel's log at `path`, or (None, why not): never raises. /dev/kmsg (a
    character device) is read record by record without blocking, up to `limit` bytes and
    KERNEL_RECORDS_LIMIT records; a plain file (a saved dmesg, a test's) its last `limit` bytes.
    Reading /dev/kmsg needs the device in the container and, where kernel.dmesg_restrict is 1,
    CAP_SYSLOG (docs/health.md)."""
    try:
        if stat.S_ISCHR(os.stat(path).st_mode):
            return _read_kmsg(path, limit), None
        with open(path, "rb") as handle:
            start = max(os.fstat(handle.fileno()).st_size - limit, 0)
            handle.seek(start)
            data = handle.read(limit)
        if start:  # the first line is cut: leave it out
            data = data.split(b"\n", 1)[1] if b"\n" in data else b""
        return data.decode(errors="replace"), None
    except OSError as exc:
        return None, f"cannot read the kernel's log at {path}: {exc.strerror or exc}"


def _read_kmsg(path: str, limit: int) -> str:
    records, size = [], 0
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    deadline = time.monotonic() + 2.0
    try:
        for _ in range(KERNEL_RECORDS_LIMIT):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:  # no record left: the buffer's end
                break
            except BrokenPipeError:  # the record was overwritten while read: the next one
                continue
            if not record or time.monotonic() > deadline:
                break
            records.append(record.decode(errors="replace").split("\n", 1)[0])
            size += len(record)
            while size > limit and records:
                size -= len(records.pop(0)) + 1
    finally:
        os.close(fd)
    return "\n".join(records)


def faults_since(faults: list[dict], boot: float | None, since: float) -> list[dict]:
    """The faults from `since` on (unix seconds, each given `at` from the boot time); every one when
    the boot time or a fault's time is unknown (the log holds this boot only)."""
    kept = []
    for fault in faults:
        at = None if boot is None or fault.get("uptime_s") is None else boot + fault["uptime_s"]
        if at is None or at >= since:
            kept.append({**fault, "at": at})
    return kept


def boot_time(path: str = "/proc/stat") -> float | None:
    """When this node booted (unix seconds, /proc/stat's btime), None when unknown."""
    try:
        with open(path) as handle:
            return next(float(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def recent_kernel_faults(path: str, since: float) -> dict:
    """{faults, error}: this node's kernel OOM kills and Xids from `since` on; never raises."""
    text, why = read_kernel_log(path)
    if text is None:
        return {"faults": [], "error": why}
    return {"faults": faults_since(kernel_faults(text), boot_time(), since), "error": None}


def fault_summary(diagnosis: dict) -> dict | None:
    """{kind: memory | gpu, says} from a diagnosis: a GPU's Xid, a container Docker saw OOM-killed (its
    main process: OOMKilled; any of its processes: an `oom` event), the kernel's OOM kills, the memory
    guard's stop; None when none is recorded (a plain crash)."""
    says: list[tuple[str, str]] = []
    for node, faults in sorted((diagnosis.get("kernel") or {}).items()):
        for fault in (faults or {}).get("faults") or []:
            if fault.get("kind") == "xid":
                says.append(("gpu", f"{node}: NVRM Xid {fault['xid']} ({fault['meaning']})"))
            elif fault.get("kind") == "oom_kill":
                says.append(("memory", f"{node}: the kernel's OOM killer killed {fault['process']} "
                                       f"(pid {fault['pid']})"))  # fmt: skip
    for node, found in sorted((diagnosis.get("containers") or {}).items()):
        for container in found or []:
            if container.get("oom_killed"):
                says.append(
                    ("memory", f"{node}: {container.get('name')} was OOM-killed (Docker's OOMKilled)")
                )
    for event in diagnosis.get("docker_oom") or []:
        says.append(
            (
                "memory",
                f"{event.get('node')}: Docker's oom event: the kernel's OOM killer killed a process in "
                f"{event.get('name')}",
            )
        )
    guard = diagnosis.get("memory_guard")
    if guard:
        says.append(("memory", str(guard.get("message"))))
    if not says:
        return None
    kind = "gpu" if any(k == "gpu" for k, _ in says) else "memory"
    return {"kind": kind, "says": "; ".join(dict.fromkeys(s for _, s in says))}


# ---- Docker's multiplexed log stream -----------------------------------------------------------------


def demux_logs(raw: bytes, newlines_only: bool = False) -> list[str]:
    """The lines of `GET /containers/{id}/logs` for a container without a TTY (8-byte frame headers:
    stream, 0, 0, 0, big-endian length); a stream without such headers is taken as plain text.
    `newlines_only`: split at `\n` alone, as Docker does when it timestamps a line (a progress bar's
    `\r` stays inside its line)."""
    out, at = [], 0
    if raw[:1] in (b"\x00", b"\x01", b"\x02") and raw[1:4] == b"\x00\x00\x00":
        while at + 8 <= len(raw):
            size = int.from_bytes(raw[at + 4 : at + 8], "big")
            out.append(raw[at + 8 : at + 8 + size])
            at += 8 + size
        raw = b"".join(out)
    text = raw.decode(errors="replace")
    return text.rstrip("\n").split("\n") if newlines_only else text.splitlines()


# ---- the node's own Docker (the mounted socket) ------------------------------------------------------


def inspect(socket_path: str, name: str, timeout: float = 10.0) -> dict:
    """{name, state, exit_code, started_at, restarts, id} of one container (state `missing` when absent,
    `unknown` with `error` when the daemon cannot be asked)."""
    url = f"/containers/{engine_api.quote(name)}/json"
    try:
        status, found = engine_api.get_json(socket_path, url, timeout)
    except engine_api.FAILED as exc:
        return {"name": name, "state": "unknown", "error": f"{type(exc).__name__}: {exc}"}
    if status == 404:
        return {"name": name, "state": "missing"}
    if status != 200 or not isinstance(found, dict):
        return {"name": name, "state": "unknown", "error": f"the daemon answered {status}"}
    state = found.get("State") or {}
    return {
        "name": name,
        "state": state.get("Status", "unknown"),
        "exit_code": state.get("ExitCode"),
        "started_at": state.get("StartedAt"),
        "restarts": found.get("RestartCount"),
        "id": found.get("Id"),
        # Docker saw the container's memory cgroup kill one of its processes (the kernel's OOM killer).
        "oom_killed": bool(state.get("OOMKilled")),
    }


def act(socket_path: str, action: str, name: str, stop_timeout_s: int, timeout: float) -> dict:
    """`stop`, `start` or `restart` one container: {ok, status, error}. 304 (already so) is ok."""
    query = f"?t={int(stop_timeout_s)}" if action in ("stop", "restart") else ""
    url = f"/containers/{engine_api.quote(name)}/{action}{query}"
    try:
        status, body = engine_api.call(socket_path, "POST", url, timeout)
    except engine_api.FAILED as exc:
        return {"ok": False, "status": None, "error": f"{type(exc).__name__}: {exc}"}
    if status in (204, 304):
        return {"ok": True, "status": status, "error": None}
    return {"ok": False, "status": status, "error": daemon_message(body)}


def daemon_message(body: bytes) -> str:
    """The daemon's own words for a refusal: its JSON `message`, else the body's first 200 bytes."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message is not None else body[:200].decode(errors="replace")


def stamped_logs(
    socket_path: str, name: str, since: float, until: float, limit: int, timeout: float = 30.0
) -> list[str]:
    """The container's log lines between `since` and `until` (unix seconds), at most the first `limit`,
    each led by Docker's timestamp; OSError when the daemon cannot give them."""
    window = f"since={int(since)}&until={int(until) + 1}"
    url = f"/containers/{engine_api.quote(name)}/logs?stdout=1&stderr=1&timestamps=1&{window}"
    try:
        status, body = engine_api.call(socket_path, "GET", url, timeout)
    except engine_api.FAILED as exc:
        raise OSError(f"{type(exc).__name__}: {exc}") from None
    if status != 200:
        raise OSError(f"the daemon answered {status} for the logs of {name}")
    return demux_logs(body, newlines_only=True)[: int(limit)]


def logs(socket_path: str, name: str, tail: int, timeout: float = 10.0) -> list[str]:
    """The container's last `tail` log lines (stdout and stderr), or one line saying why not."""
    url = f"/containers/{engine_api.quote(name)}/logs?stdout=1&stderr=1&tail={int(tail)}"
    try:
        status, body = engine_api.call(socket_path, "GET", url, timeout)
    except engine_api.FAILED as exc:
        return [f"(no logs: {type(exc).__name__}: {exc})"]
    if status != 200:
        return [f"(no logs: the daemon answered {status})"]
    return demux_logs(body)[-int(tail) :]


# ---- Docker's event log: what happened to a container, and when ---------------------------------------

# The container events the watchdog reads; others (exec_*, health_status, attach, …) are left out.
EVENT_ACTIONS = ("create", "start", "restart", "kill", "die", "oom", "stop", "destroy", "pause", "unpause")
EVENTS_ANSWER_LIMIT = 4 << 20  # bytes: the daemon keeps its last 256 events, a few hundred bytes each
EVENTS_KEPT_PER_READ = 1000


def parse_events(body: bytes, names: Iterable[str]) -> list[dict]:
    """Docker's `GET /events` answer (one JSON object a line) as {at, action, name, id, exit_code,
    signal} per event of the containers named `names`, oldest first (pure). The daemon's `container`
    filter matches a name's prefix too (`x` matches `x-memory-probe`): only exact names are kept."""
    wanted, found = set(names), []
    decoder = json.JSONDecoder()
    text, at = body.decode(errors="replace"), 0
    while len(found) < EVENTS_KEPT_PER_READ:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            break
        try:
            message, at = decoder.raw_decode(text, at)
        except ValueError:  # a cut or foreign line: the rest is not read
            break
        event = event_facts(message)
        if event is not None and event["name"] in wanted:
            found.append(event)
    return sorted(found, key=lambda e: e["at"])


def event_facts(message: object) -> dict | None:
    """One Docker event message (`{"Type": "container", "Action": "die", "Actor": {"ID", "Attributes":
    {"name", "exitCode"}}, "timeNano"}`) as the watchdog keeps it, or None for another kind."""
    if not isinstance(message, dict) or message.get("Type", "container") != "container":
        return None
    actor = message.get("Actor") if isinstance(message.get("Actor"), dict) else {}
    attributes = actor.get("Attributes") if isinstance(actor.get("Attributes"), dict) else {}
    action = str(message.get("Action") or message.get("status") or "")
    if action not in EVENT_ACTIONS:
        return None
    nano, seconds = message.get("timeNano"), message.get("time")
    if isinstance(nano, int):
        at = nano // 10**9 + (nano % 10**9) / 1e9  # as one float division would not: to the microsecond
    elif isinstance(seconds, int | float):
        at = float(seconds)
    else:
        return None
    code = str(attributes.get("exitCode", ""))
    return {
        "at": at,
        "action": action,
        "name": str(attributes.get("name") or ""),
        "id": str(actor.get("ID") or message.get("id") or ""),
        "exit_code": int(code) if action == "die" and code.lstrip("-").isdigit() else None,
        "signal": str(attributes["signal"]) if action == "kill" and "signal" in attributes else None,
    }


def events(
    socket_path: str, since: float, until: float, names: Iterable[str], timeout: float = 10.0
) -> tuple[list[dict], str | None]:
    """Docker's events of the containers `names` from `since` to `until` (unix seconds, this node's
    clock), in one bounded read that never streams: `until` is in the past (it is cut to now), so the
    daemon answers from its log and closes. (events, None), or ([], why not): never raises."""
    names = sorted(set(names))
    until = min(until, time.time())
    if not names or int(until) < int(since):
        return [], None
    filters = json.dumps({"type": ["container"], "container": names}, separators=(",", ":"))
    url = f"/events?since={int(since)}&until={int(until)}&filters={engine_api.quote(filters, safe='')}"
    try:
        status, body = engine_api.call(
            socket_path, "GET", url, timeout, limit=EVENTS_ANSWER_LIMIT, total_s=timeout
        )
    except engine_api.FAILED as exc:
        return [], f"{type(exc).__name__}: {exc}"
    if status != 200:
        return [], f"the daemon answered {status} for its events: {daemon_message(body)}"
    return parse_events(body, names), None
