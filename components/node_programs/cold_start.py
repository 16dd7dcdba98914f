"""How long one start of a vLLM server took, from vLLM's own log lines: standard library only, pure.

A start runs from the container's start (Docker's `State.StartedAt`) through vLLM's milestones, each
found in the container's log as Docker timestamps it (`docker logs --timestamps --since <StartedAt>`,
or the Engine API's `logs?timestamps=1&since=`):

    weights_loaded  the last `Loading weights took N seconds` (vLLM's model loader, once per rank
                    in this container)
    engine_ready    `init engine (profile, create kv cache, warmup model) took N s` (EngineCore: the
                    KV cache sized, the model warmed up or compiled)
    api_ready       `Application startup complete.` (the API server listens; vLLM logs `Starting
                    vLLM server on …` just before)
    first_completion  given by the readiness gate, from its own completion: only when it waited
                    from before `api_ready`, else it is not the start's first (the watchdog gives none)

Every figure is seconds after the container's start, all read on one host's clock (the daemon's
timestamps and the caller's `time.time()` on the same node). vLLM's own durations come beside them
(`vllm`: the load, the engine's init and its compile time). The gate (`readiness.py`) and the
watchdog (`watchdog.py`) import this library; it travels with them to the node.
"""

import re
from datetime import datetime, timedelta, timezone

# Docker's RFC 3339 timestamps: nanoseconds, `Z` or an offset.
_STAMP = re.compile(r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$")
# vLLM's lines, each named by what it marks (the regex's group, where it has one, is vLLM's duration).
WEIGHTS = re.compile(r"Loading weights took ([0-9.]+) seconds")
ENGINE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s(?: \(compilation: ([0-9.]+) s)?"
)
API = re.compile(r"Application startup complete\.")
# `… GiB memory and N seconds` (older vLLM) or `… GiB and N seconds` (newer).
MODEL_MEMORY = re.compile(r"Model loading took ([0-9.]+) GiB (?:memory )?and ([0-9.]+) seconds")
MILESTONES = ("weights_loaded", "engine_ready", "api_ready", "first_completion")
# Every line `milestones` reads: a reader of a long log keeps these alone.
MARKS = (WEIGHTS, ENGINE, API, MODEL_MEMORY)


def parse_stamp(text: str) -> float | None:
    """Unix seconds of an RFC 3339 timestamp (Docker's, nanoseconds kept to microseconds); None if it
    is not one (Docker's zero time `0001-01-01T00:00:00Z`, for a container never started, is 0 or less)."""
    match = _STAMP.match(text.strip())
    if not match:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    micro = int((fraction or "0")[:6].ljust(6, "0"))
    tz = timezone.utc
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    try:
        moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tz)
    except ValueError:
        return None
    value = moment.timestamp()
    return value if value > 0 else None


def stamped(line: str) -> tuple[float | None, str]:
    """(Docker's timestamp, the rest) of one `--timestamps` log line; (None, line) without one."""
    head, _, rest = line.partition(" ")
    at = parse_stamp(head)
    return (at, rest) if at is not None else (None, line)


def milestones(lines: list[str], started_at: float) -> dict:
    """What vLLM's log says of the start that began at `started_at`: each milestone's Unix time
    (`at`), vLLM's own durations (`vllm`), and the milestones it never logged (`missing`). Lines
    before `started_at` (an earlier run of the same container) are not this start's."""
    at: dict[str, float] = {}
    vllm: dict[str, float] = {}
    for line in lines:
        when, text = stamped(line)
        if when is None or when < started_at:
            continue
        weights = WEIGHTS.search(text)
        if weights:
            at["weights_loaded"] = when
            vllm["load_weights_s"] = max(float(weights.group(1)), vllm.get("load_weights_s", 0.0))
        memory = MODEL_MEMORY.search(text)
        if memory:
            vllm["model_memory_gib"] = float(memory.group(1))
            vllm["model_loading_s"] = float(memory.group(2))
        engine = ENGINE.search(text)
        if engine:
            at["engine_ready"] = when
            vllm["init_engine_s"] = float(engine.group(1))
            if engine.group(2):
                vllm["compile_s"] = float(engine.group(2))
        if API.search(text) and "api_ready" not in at:
            at["api_ready"] = when
    missing = [name for name in MILESTONES[:3] if name not in at]
    return {"at": at, "vllm": vllm, "missing": missing}


def cold_start(
    started_at_text: str,
    lines: list[str],
    completion_at: float | None = None,
    waited_from: float | None = None,
) -> dict | None:
    """One start's record: `started_at` (Unix), each milestone in seconds after it (None where vLLM
    did not log it), vLLM's own durations, and `first_completion_s` when the caller's completion at
    `completion_at` is the start's first: the caller waited from `waited_from`, before `api_ready`.
    None when `started_at_text` is not a start time."""
    started = parse_stamp(started_at_text)
    if started is None:
        return None
    found = milestones(lines, started)
    seconds = {f"{name}_s": round(found["at"][name] - started, 1) for name in found["at"]}
    api = found["at"].get("api_ready")
    first = None
    if completion_at is not None and waited_from is not None and api is not None and waited_from <= api:
        first = round(completion_at - started, 1)
    return {
        "started_at": round(started, 3),
        **{f"{name}_s": seconds.get(f"{name}_s") for name in MILESTONES[:3]},
        "first_completion_s": first,
        "vllm": found["vllm"],
        "missing": found["missing"],
    }


def summary(record: dict | None) -> str:
    """One line of a start's figures: `weights 28.1 s, engine 29.7 s, API 31.3 s, first completion
    33.0 s after the container's start` (a figure vLLM did not log is left out)."""
    if not isinstance(record, dict):
        return "not measured"
    names = (
        ("weights_loaded_s", "weights"),
        ("engine_ready_s", "engine"),
        ("api_ready_s", "API"),
        ("first_completion_s", "first completion"),
    )
    parts = [
        f"{label} {record[key]:.1f} s" for key, label in names if isinstance(record.get(key), (int, float))
    ]
    if not parts:
        return "no vLLM milestone in the server's log"
    text = ", ".join(parts) + " after the container's start"
    compile_s = (record.get("vllm") or {}).get("compile_s")
    if isinstance(compile_s, (int, float)):
        text += f" (compile {compile_s:.1f} s)"
    return text
