"""What one node holds and runs, for `status`: one JSON report on stdout. Runs ON THE NODE.

Standard library only; no argument carries anything: the request (image reference, container names,
cache path, …) arrives as one JSON object on stdin, so an API key or token could never reach argv.
Everything is read, nothing is changed. Each fact is gathered on its own: a failing `docker` or a
missing cache still leaves the other facts in the report, with the error next to the fact.

Facts: Docker engine version and image store; the deployment image (ID and diff IDs); each declared
container (state, restarts, uptime, last exit code, image, the `--node-rank` it runs); GPUs
(`nvidia-smi`); the checkpoint in the Hugging Face cache (revision, files present, manifest digest);
on the head, `ray status` and Ray's node list, and the health watchdog's `/state` (over the node's
own address); operations in flight from `$HOME/.qwen35/progress/*.json`.
"""

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

from components.node_programs.wire import PROGRESS_DIR, TAG_RECORDS, image_store, manifest_digest

# Seconds any one command may take: a hung daemon must not hang the whole status.
COMMAND_TIMEOUT_S = 20.0
# A progress file not rewritten for this long belongs to an operation that is no longer moving.
PROGRESS_STALE_S = 120.0
# At most this many missing checkpoint files are named (the count is always given).
MISSING_SHOWN = 10
# The watchdog answers /state from memory: one that takes longer than this is reported as not answering.
WATCHDOG_TIMEOUT_S = 5.0
# A /state larger than this is not the watchdog's.
WATCHDOG_MAX_BYTES = 1 << 20


def run(argv, timeout=COMMAND_TIMEOUT_S):
    """(exit status, stdout, stderr) of argv; 127 when the program is not installed, 124 on timeout."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not installed"
    except subprocess.TimeoutExpired:
        return 124, "", f"`{' '.join(argv[:3])}` did not answer within {timeout:g} s"
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


def _tail(text, lines=3):
    return "\n".join(text.strip().splitlines()[-lines:])


def docker_facts():
    code, out, err = run(["docker", "info", "--format", "{{json .}}"])
    if code != 0:
        return {"ok": False, "error": _tail(err or out) or f"docker info exited {code}"}
    try:
        info = json.loads(out)
    except ValueError:
        return {"ok": False, "error": f"docker info answered no JSON: {out[:120]!r}"}
    if info.get("ServerErrors"):
        return {"ok": False, "error": "; ".join(info["ServerErrors"])[:300]}
    return {
        "ok": True,
        "version": info.get("ServerVersion") or "",
        "store": image_store(info.get("DriverStatus")),
        "driver": info.get("Driver") or "",
    }


def image_facts(ref):
    code, out, err = run(["docker", "image", "inspect", ref])
    if code != 0:
        gone = "No such image" in err or "No such object" in err
        return {"ref": ref, "present": False, "error": "" if gone else _tail(err)}
    item = json.loads(out)[0]
    return {
        "ref": ref,
        "present": True,
        "id": item.get("Id") or "",
        "layers": list((item.get("RootFS") or {}).get("Layers") or []),
        "previous": previous_images(ref),
    }


def previous_images(ref, folder=TAG_RECORDS):
    """The replaced images of `ref`'s repository this node keeps for a rollback (image.keep_previous):
    NodeImage's tag records that no resource holds, marked kept; newest first."""
    repo = ref.rpartition(":")[0] or ref
    kept = []
    path = os.path.expanduser(folder)
    for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
        try:
            with open(os.path.join(path, name)) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not record.get("retained_at") or record.get("holders"):
            continue
        if str(record.get("ref") or "").rpartition(":")[0] == repo and record.get("ref") != ref:
            kept.append((record["retained_at"], record["ref"]))
    return [found for _, found in sorted(kept, reverse=True)]


def _seconds_since(stamp, now):
    """Seconds from Docker's RFC 3339 time (nanoseconds, Z) to `now`; None for Docker's zero time."""
    if not stamp or stamp.startswith("0001-"):
        return None
    whole = stamp.split(".")[0].rstrip("Z")
    try:
        then = datetime.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        return None
    return max(0, int(now - then.timestamp()))


def container_facts(names, now):
    facts = {name: {"present": False} for name in names}
    if not names:
        return facts
    # One call for all of them; a missing one makes docker exit 1 but the others are still printed.
    code, out, err = run(["docker", "container", "inspect", *names])
    try:
        items = json.loads(out) if out.strip() else []
    except ValueError:
        items = []
    for item in items:
        name = str(item.get("Name") or "").lstrip("/")
        if name not in facts:
            continue
        state = item.get("State") or {}
        running = state.get("Status") == "running"
        facts[name] = {
            "present": True,
            "state": state.get("Status") or "",
            "restarts": int(item.get("RestartCount") or 0),
            "exit_code": int(state.get("ExitCode") or 0),
            "uptime_s": _seconds_since(state.get("StartedAt"), now) if running else None,
            "error": state.get("Error") or "",
            "image": item.get("Image") or "",
            "node_rank": node_rank(item.get("Args")),
        }
    if code != 0 and not items:
        for name in names:
            facts[name]["error"] = _tail(err)
    return facts


def node_rank(args):
    """The `--node-rank` a `vllm serve` container runs (vLLM's own multi-node executor), else None."""
    args = [str(a) for a in (args or [])]
    for i, arg in enumerate(args):
        if arg == "--node-rank" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--node-rank="):
            return arg.split("=", 1)[1]
    return None


def gpu_facts():
    if shutil.which("nvidia-smi") is None:
        return {"tool": False, "count": 0, "names": []}
    code, out, err = run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    if code != 0:
        return {"tool": True, "count": 0, "names": [], "error": _tail(err or out)}
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return {"tool": True, "count": len(names), "names": names}


def _snapshot_pairs(snapshot):
    """(relative path, blob name) of every file of a snapshot; blob None when the file is missing."""
    pairs = []
    for folder, _dirs, files in os.walk(snapshot):
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, snapshot)
            # Snapshot entries link to ../../blobs/<hash>; the blob's name is the file's hash. A blob
            # that is itself a link into a shared store still carries its name here.
            target = os.path.realpath(path)
            if not os.path.isfile(target):
                pairs.append((rel, None, 0))
                continue
            size = os.path.getsize(target)
            # A plain file (a cache copied with links dereferenced) is not re-hashed here: 120 GB
            # would take minutes. It gets a marker, so its digest differs from a proper cache's.
            blob = os.path.basename(os.readlink(path)) if os.path.islink(path) else f"unlinked:{size}"
            pairs.append((rel, blob, size))
    return pairs


def checkpoint_facts(cache, model, revision="main"):
    """The model's snapshot in the Hub cache layout under `cache` (HF_HOME): present, complete, digest."""
    cache = os.path.expanduser(cache)
    if model.startswith("/"):
        present = os.path.isfile(os.path.join(model, "config.json"))
        return {"path": model, "present": present, "local_dir": True}
    repo = os.path.join(cache, "hub", "models--" + model.replace("/", "--"))
    facts = {"path": repo, "present": False}
    ref_file = os.path.join(repo, "refs", revision)
    commit = revision
    if os.path.isfile(ref_file):
        with open(ref_file) as handle:
            commit = handle.read().strip()
    snapshot = os.path.join(repo, "snapshots", commit)
    if not os.path.isdir(snapshot):
        facts["error"] = f"no snapshot for {revision!r} in {repo}"
        return facts
    pairs = _snapshot_pairs(snapshot)
    missing = sorted(rel for rel, blob, _size in pairs if blob is None)
    facts.update(
        present=bool(pairs) and not missing,
        revision=commit,
        files=len(pairs),
        bytes=sum(size for _rel, _blob, size in pairs),
        missing=missing[:MISSING_SHOWN],
        missing_count=len(missing),
        digest=manifest_digest((rel, blob or "") for rel, blob, _size in pairs),
        snapshot=snapshot,
    )
    return facts


# vLLM's start-up line (vllm/v1/core/kv_cache_utils.py): what the KV cache it allocated holds.
CONCURRENCY_LINE = re.compile(r"Maximum concurrency for ([0-9,]+) tokens per request: ([0-9.]+)x")


def sizing_facts(snapshot):
    """What the KV-cache sizing needs of the head's snapshot: config.json and the index's total size."""
    facts = {}
    try:
        with open(os.path.join(snapshot, "config.json")) as handle:
            facts["config"] = json.load(handle)
        with open(os.path.join(snapshot, "model.safetensors.index.json")) as handle:
            facts["weight_bytes"] = (json.load(handle).get("metadata") or {}).get("total_size")
    except (OSError, ValueError) as exc:
        facts["error"] = type(exc).__name__ + ": " + str(exc)
    return facts


def server_concurrency(container):
    """The last 'Maximum concurrency' line the server logged: (max_model_len, concurrency), or {}."""
    code, out, err = run(["docker", "logs", "--tail", "5000", container])
    found = CONCURRENCY_LINE.findall((out or "") + "\n" + (err or "")) if code == 0 else []
    if not found:
        return {}
    tokens, times = found[-1]
    return {"max_model_len": int(tokens.replace(",", "")), "max_concurrency": float(times)}


def ray_facts(container):
    code, status, err = run(["docker", "exec", container, "ray", "status"])
    facts = {"status": status if code == 0 else "", "error": "" if code == 0 else _tail(err or status)}
    code, nodes, _err = run(["docker", "exec", container, "ray", "list", "nodes", "--format", "json"])
    facts["nodes_json"] = nodes if code == 0 else ""
    return facts


def _pid_alive(pid):
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


def progress_facts(folder, now):
    """Every progress file, with whether its writer still lives and moved recently."""
    folder = os.path.expanduser(folder)
    found = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return found
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name)) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict):
            continue
        updated = record.get("updated_at")
        age = now - updated if isinstance(updated, (int, float)) else None
        record["alive"] = _pid_alive(record.get("pid"))
        record["stale"] = age is None or age > PROGRESS_STALE_S
        record["age_s"] = None if age is None else round(age, 1)
        found.append(record)
    return found


def watchdog_facts(url, timeout=WATCHDOG_TIMEOUT_S):
    """{"state": the watchdog's /state} or {"error": why it did not answer} (never raises)."""
    # No proxy: the watchdog listens on this node's own address.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as answer:
            body = answer.read(WATCHDOG_MAX_BYTES + 1)
    except urllib.error.HTTPError as exc:
        return {"error": f"{url}: HTTP {exc.code}"}
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return {"error": f"{url}: {reason}"}
    if len(body) > WATCHDOG_MAX_BYTES:
        return {"error": f"{url}: answered more than {WATCHDOG_MAX_BYTES} bytes"}
    try:
        state = json.loads(body)
    except ValueError:
        return {"error": f"{url}: answered no JSON"}
    if not isinstance(state, dict) or "state" not in state:
        return {"error": f"{url}: answered JSON without a `state`"}
    return {"state": state}


def gather(request):
    now = time.time()
    report = {"docker": docker_facts(), "now": now}
    if report["docker"]["ok"]:
        report["image"] = image_facts(request["image"])
        report["containers"] = container_facts(list(request.get("containers") or []), now)
        if request.get("ray_container"):
            report["ray"] = ray_facts(request["ray_container"])
    report["gpus"] = gpu_facts()
    if request.get("model"):
        report["checkpoint"] = checkpoint_facts(
            request["hf_cache"], request["model"], request.get("revision") or "main"
        )
        snapshot = report["checkpoint"].get("snapshot")
        if request.get("sizing") and snapshot:
            report["sizing"] = sizing_facts(snapshot)
    if request.get("server_container") and report["docker"]["ok"]:
        report["server_concurrency"] = server_concurrency(request["server_container"])
    if request.get("watchdog_url"):
        report["watchdog"] = watchdog_facts(request["watchdog_url"])
    report["progress"] = progress_facts(request.get("progress_dir") or PROGRESS_DIR, now)
    return report


def main():
    request = json.loads(sys.stdin.read())
    print(json.dumps(gather(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
