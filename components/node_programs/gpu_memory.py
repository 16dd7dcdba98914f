"""vLLM's start-up memory rule, judged with the figures the deployment image's own torch and vLLM
report on the node (issue 41 item 4). A library, standard library only: the watchdog and the agents
ship it.

vLLM refuses to start unless the free memory it measures is at least `gpu_memory_utilization ×
total` (`request_memory` in vllm/v1/worker/utils.py: "Free memory on device … is less than desired
GPU memory utilization"). Which free figure it measures depends on the release and the device: CUDA's
`cudaMemGetInfo` free, or, on a unified-memory GPU that release knows (GB10 in recent ones), the
kernel's MemAvailable (vllm #35313). On GB10 CUDA's free figure leaves out reclaimable page cache,
which MemAvailable counts, so a node can pass a MemAvailable check and still be refused by vLLM.

So the check asks the image: a short-lived container of the node's serving container's image, with
that container's devices, GPU requests, runtime and environment, runs `PROBE` (the image's python3):
torch's `mem_get_info` and device, and vLLM's own `MemorySnapshot` where it imports (the very
figure its rule compares). `startup_rule` then applies the rule and tells page cache apart from
memory something else holds.
"""

from __future__ import annotations

import contextlib
import json
import math
import time

from components.node_programs import engine_api, health_wire

gb1 = health_wire.gb1  # GB with one decimal, as the memory guard says them

PROBE_SUFFIX = "-memory-probe"  # the probe container's name: the template's, with this after it
PROBE_LABEL = "qwen35.memory-probe"  # on the probe container: the serving container it copies
PROBE_TIMEOUT_S = 180.0  # inspect, create, start (torch and vLLM import, CUDA initialises), wait, logs
REMOVE_S = 15.0  # the probe container's removal, after PROBE_TIMEOUT_S: it always runs
MARKER = "QWEN35_MEMORY_PROBE "  # leads the probe's report line (a library's JSON log line is not it)
# What frees the page cache on a node (root): NVIDIA's DGX Spark guides give the same line.
DROP_CACHES = "sudo sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'"
# From the serving container's HostConfig: what gives the probe the same GPU, nothing else.
_HOST_KEYS = ("Runtime", "DeviceRequests", "Devices", "DeviceCgroupRules", "Privileged", "Ulimits")

# Run by the image's python3 (site packages on: the image's torch and vLLM are what is asked). One
# line on stdout, MARKER and JSON, last; every failure is a field of it, never a traceback alone.
PROBE = r"""
import json, sys
def say(out):
    print("QWEN35_MEMORY_PROBE " + json.dumps(out), flush=True)
out = {"python": sys.version.split()[0]}
try:
    import torch
except Exception as exc:
    out["error"] = f"torch does not import: {type(exc).__name__}: {exc}"
    say(out); raise SystemExit(0)
out["torch"] = torch.__version__
try:
    out["cuda"] = bool(torch.cuda.is_available())
    if out["cuda"]:
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        out.update(device=props.name, capability=f"{props.major}.{props.minor}",
                   integrated=bool(getattr(props, "is_integrated", False)),
                   cuda_free_bytes=int(free), cuda_total_bytes=int(total))
except Exception as exc:
    out["error"] = f"CUDA: {type(exc).__name__}: {exc}"
    say(out); raise SystemExit(0)
if out["cuda"]:
    try:
        import vllm
        out["vllm"] = getattr(vllm, "__version__", None)
        try:
            from vllm.utils.mem_utils import MemorySnapshot
        except ImportError:
            from vllm.utils import MemorySnapshot
        try:
            snap = MemorySnapshot(device=torch.device("cuda", 0))
        except TypeError:
            snap = MemorySnapshot()
        out.update(vllm_free_bytes=int(snap.free_memory), vllm_total_bytes=int(snap.total_memory))
    except Exception as exc:
        out["vllm_error"] = f"{type(exc).__name__}: {exc}"[:300]
say(out)
"""


def probe_name(template: str) -> str:
    return f"{template}{PROBE_SUFFIX}"


def probe_body(template: dict, program: str = PROBE) -> dict:
    """The probe container's create body from the serving container's `docker inspect` (pure): its
    image (by ID), environment, user and GPU access; no network, no restart, no mounts."""
    config, host = template.get("Config") or {}, template.get("HostConfig") or {}
    return {
        "Image": template["Image"],
        "Entrypoint": ["python3", "-c"],
        "Cmd": [program],
        "Env": list(config.get("Env") or []),
        "User": config.get("User") or "",
        "Labels": {PROBE_LABEL: str(template.get("Name", "")).lstrip("/")},
        "NetworkDisabled": True,
        "HostConfig": {
            **{key: host[key] for key in _HOST_KEYS if host.get(key)},
            "NetworkMode": "none",
            "RestartPolicy": {"Name": "no"},
        },
    }


def last_report(lines: list[str]) -> dict | None:
    """The probe's report: the last line of its output led by MARKER, when it holds a JSON object."""
    for line in reversed(lines):
        if line.startswith(MARKER):
            try:
                found = json.loads(line[len(MARKER) :])
            except ValueError:
                return None
            return found if isinstance(found, dict) else None
    return None


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("message"))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


def run_probe(socket_path: str, template: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """Run `PROBE` on this node beside `template` (a container of the stack): {report, error, took_s},
    and `output` (its last lines) when it printed no report: the error never carries the container's
    output, which goes to the watchdog's log only (/state answers anyone who can reach it).
    Every step within `timeout_s` in all; then the probe container is removed whatever happened (at
    most REMOVE_S more)."""
    started = time.monotonic()
    name = probe_name(template)
    quoted = engine_api.quote(name)

    def call(method: str, url: str, cap: float, body: object = None) -> tuple[int, bytes]:
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:
            raise TimeoutError(f"{name}: {timeout_s:g} s spent before {method} {url.split('?')[0]}")
        return engine_api.call(socket_path, method, url, min(cap, left), body)

    def done(report: dict | None, error: str | None, output: str | None = None) -> dict:
        found = {"report": report, "error": error, "took_s": round(time.monotonic() - started, 3)}
        return {**found, "output": output} if output is not None else found

    lines: list[str] = []
    code = None
    try:
        status, found = call("GET", f"/containers/{engine_api.quote(template)}/json", 10.0)
        if status != 200:
            return done(None, f"cannot inspect {template}: the daemon answered {status}")
        call("DELETE", f"/containers/{quoted}?force=1", 30.0)  # a leftover of an earlier probe
        status, body = call("POST", f"/containers/create?name={quoted}", 30.0, probe_body(json.loads(found)))
        if status != 201:
            return done(None, f"cannot create {name}: {_message(body)}")
        try:
            status, body = call("POST", f"/containers/{quoted}/start", timeout_s)
            if status not in (204, 304):
                return done(None, f"cannot start {name}: {_message(body)}")
            status, body = call("POST", f"/containers/{quoted}/wait", timeout_s)
            code = json.loads(body).get("StatusCode") if status == 200 else None
            status, raw = call("GET", f"/containers/{quoted}/logs?stdout=1&stderr=1", 30.0)
            lines = health_wire.demux_logs(raw) if status == 200 else []
        finally:
            with contextlib.suppress(*engine_api.FAILED):
                engine_api.call(socket_path, "DELETE", f"/containers/{quoted}?force=1", REMOVE_S)
    except TimeoutError:
        return done(None, f"{name} did not finish within {timeout_s:g} s")
    except engine_api.FAILED as exc:
        return done(None, f"the probe on {template}'s image failed: {type(exc).__name__}: {exc}")
    report = last_report(lines)
    if report is None:
        tail = " | ".join(lines[-3:]) or "no output"
        return done(
            None, f"{name} exited {code} without a report (its last lines: the watchdog's log)", tail[:300]
        )
    return done(report, None)


def startup_rule(report: dict | None, utilization: float, mem_available: int | None) -> dict:
    """vLLM's start-up rule on one node from its probe's report (pure). `checked` False with `why`
    where it cannot be judged (no CUDA device in the image's torch: vLLM's CPU build has no such
    rule); else `ok`, both figures, and `page_cache`: refused while MemAvailable would pass, so the
    kernel's reclaimable page cache is what stands between the node and the rule."""
    if not report:
        return {"checked": False, "why": "no report from the probe"}
    if report.get("error"):
        return {"checked": False, "why": str(report["error"])}
    if not report.get("cuda"):
        return {
            "checked": False,
            "why": f"the image's torch ({report.get('torch')}) sees no CUDA device: no start-up rule applies",
        }
    try:
        total, cuda_free = int(report["cuda_total_bytes"]), int(report["cuda_free_bytes"])
    except (KeyError, TypeError, ValueError):
        return {"checked": False, "why": f"the probe's report has no CUDA figures: {sorted(report)}"}
    if isinstance(report.get("vllm_free_bytes"), int):
        free, source = int(report["vllm_free_bytes"]), "vllm"
        total = int(report.get("vllm_total_bytes") or total)
    elif not report.get("integrated"):
        free, source = cuda_free, "cuda"  # a discrete GPU: every release counts CUDA's figure
    elif mem_available is not None:
        # A unified-memory GPU and no figure from vLLM: a release counts CUDA's free or MemAvailable.
        # Judged by the larger, so only what every release would refuse is held.
        free, source = max(cuda_free, mem_available), "cuda_or_memavailable"
    else:
        why = "no figure from vLLM, and MemAvailable unknown on a unified-memory GPU"
        return {"checked": False, "why": why}
    requested = math.ceil(total * utilization)
    ok = free >= requested
    return {
        "checked": True,
        "ok": ok,
        "free_bytes": free,
        "free_from": source,
        "requested_bytes": requested,
        "total_bytes": total,
        "utilization": utilization,
        "cuda_free_bytes": report.get("cuda_free_bytes"),
        "mem_available_bytes": mem_available,
        # Only on a unified-memory GPU is MemAvailable the GPU's memory too.
        "page_cache": bool(
            not ok and report.get("integrated") and mem_available is not None and mem_available >= requested
        ),
        "device": report.get("device"),
        "vllm": report.get("vllm"),
        "vllm_error": report.get("vllm_error"),
    }


# How each `free_from` is said: whose figure vLLM's rule was judged on.
COUNTED = {
    "vllm": "as vLLM counts it",
    "cuda": "as CUDA reports it",
    "cuda_or_memavailable": "by both CUDA's figure and MemAvailable (vLLM gave none)",
}


def rule_message(node: str, rule: dict) -> str:
    """What the watchdog says when the rule holds a restart off: both figures, and what to do."""
    counted = COUNTED.get(rule["free_from"], "")
    said = (
        f"{node}: vLLM would refuse to start: {gb1(rule['free_bytes'])} free {counted}, below "
        f"{rule['utilization']:g} × {gb1(rule['total_bytes'])} = {gb1(rule['requested_bytes'])} "
        "(serve.gpu_memory_utilization)"
    )
    available = rule.get("mem_available_bytes")
    if rule.get("page_cache"):
        return (
            f"{said}; MemAvailable is {gb1(available)}: the page cache holds the difference; free it "
            f"on {node} with `{DROP_CACHES}`"
        )
    also = f"; MemAvailable is {gb1(available)}" if isinstance(available, int) else ""
    return (
        f"{said}{also}: something else holds the memory; find it (`nvidia-smi`, `docker ps`) or reboot "
        f"{node}, or lower serve.gpu_memory_utilization"
    )
