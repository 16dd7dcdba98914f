"""The watchdog's decisions as pure functions (its policy): what a probe's failure is called, when a
completion is due and whether the engine stalls, what a change of the serving containers means, the
restart budget, what a recovery restarts, and what holds a restart. Observations in, a verdict out:
no I/O, no clock, so tests read each rule as a table. A library of `watchdog`: standard library only;
it travels with the program to the node.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from components.node_programs import cold_start, gpu_memory, health_wire
from components.node_programs.watchdog_settings import Settings, Target

# A failed probe's kind as a restart's reason (`restarts_total{reason}`); `stall`, `not_ready`,
# `docker_restart` and `memory_floor` (a node's memory guard stopped its serving containers) are the others.
REASONS = {"timeout": "hang", "refused": "down", "status": "error", "error": "error"}
# Docker states of a container that `pulumi up` (or an operator) is replacing: no verdict meanwhile.
REPLACING = ("missing", "created", "removing")
# vLLM's own figures (its /metrics): requests in the engine (running, waiting), and the tokens it has
# computed so far, prompt and generated (a long prefill is progress too). Running and generated are
# required; the others count as 0 where a server does not export them.
RUNNING_METRIC = "vllm:num_requests_running"
WAITING_METRIC = "vllm:num_requests_waiting"
TOKENS_METRIC = "vllm:generation_tokens_total"
PROMPT_METRIC = "vllm:prompt_tokens_total"
# Docker's events (issue 53): the ones a stop makes (its `kill`: SIGTERM, and SIGKILL after the grace;
# the exit; its own `stop`), and an event this close to one of the watchdog's own acts is that act's
# (the clocks, the daemon's lag).
STOPPING = ("kill", "die", "stop")
OWN_SLACK_S = 2.0
SIGNALS = {"1": "SIGHUP", "2": "SIGINT", "3": "SIGQUIT", "9": "SIGKILL", "15": "SIGTERM"}
SPENT_NEXT_STEP = (
    "the restart budget is spent and the server and cluster containers are stopped: find the "
    "cause (last_diagnosis), then start them again (`pulumi up --refresh`); the watchdog sees "
    "them running and resets its budget"
)

# ---- the server: probes, completions, the engine's progress -------------------------------------------


def reason_for(kind: str) -> str:
    """A failed probe's kind (`Probe.kind`) as a restart's reason."""
    return REASONS.get(kind, "error")


def recovery_due(settings: Settings, count: int) -> bool:
    """After `count` failures in a row, `failures` or more: a recovery at `failures`; past it, another
    only where the watchdog acts (report mode records one per run of failures)."""
    return count == settings.failures or settings.mode != health_wire.Mode.REPORT.value


def engine_progress(text: str) -> tuple[float, float, float] | None:
    """(requests running, requests waiting, tokens computed: prompt and generated) from Prometheus
    text, each summed over its series (one per engine and model); None when requests running or tokens
    generated are absent."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in (RUNNING_METRIC, WAITING_METRIC, TOKENS_METRIC, PROMPT_METRIC):
            continue
        rest = line.rsplit("}", 1)[1] if "{" in line else line[len(name) :]
        try:
            sums[name] = sums.get(name, 0.0) + float(rest.split()[0])
        except (ValueError, IndexError):
            continue
    if RUNNING_METRIC not in sums or TOKENS_METRIC not in sums:
        return None
    return (
        sums[RUNNING_METRIC],
        sums.get(WAITING_METRIC, 0.0),
        sums[TOKENS_METRIC] + sums.get(PROMPT_METRIC, 0.0),
    )


def track_progress(
    found: tuple[float, float, float] | None, last: dict | None, stall_since: float | None, now: float
) -> tuple[float | None, dict | None]:
    """(stall_since, progress) after a /metrics read that found `found` (`engine_progress`), given the
    last read's progress: since when requests have been in the engine without a token computed."""
    if found is None:
        return None, None
    running, waiting, tokens = found
    if running + waiting <= 0:
        stall_since = None
    elif stall_since is None or last is None or tokens != last["tokens"]:
        stall_since = now
    stalled = 0.0 if stall_since is None else now - stall_since
    return stall_since, {"running": running, "waiting": waiting, "tokens": tokens, "stalled_s": stalled}


def completion_deadline(
    settings: Settings, before: tuple[float, float, float] | None, completion_failures: int, probes: int
) -> float | None:
    """The deadline of the completion due on probe number `probes`, None when none is due: every probe
    while the engine is idle (the short deadline: an idle engine answers one token at once), every
    probe after a failed one, else every `completion_every`-th probe."""
    idle = before is not None and before[0] + before[1] <= 0
    if not idle and not completion_failures and probes % settings.completion_every:
        return None
    return settings.idle_deadline_s() if idle else settings.completion_deadline_s


# ---- the serving containers -------------------------------------------------------------------------


def parse_started_at(text: str) -> float | None:
    """Docker's `State.StartedAt` (RFC 3339, UTC, nanoseconds) as unix seconds; None for none."""
    return cold_start.parse_stamp(text or "")


def grace_start(grace_from: float, started: float | None, boot: float | None) -> float:
    """When the start-up grace runs from: the server container's start where that is earlier and in
    this boot (a start from the last boot counts for nothing), else `grace_from`."""
    if started is not None and (boot is None or started >= boot) and started < grace_from:
        return started
    return grace_from


def replacing(known: dict[tuple[str, str], dict]) -> list[str]:
    """`name state` of each serving container that is being replaced (missing, created, removing)."""
    return sorted(f"{n} {c['state']}" for (_, n), c in known.items() if c["state"] in REPLACING)


def serving_changes(
    before: dict[tuple[str, str], dict],
    known: dict[tuple[str, str], dict],
    acting: bool,
    starts: dict[tuple[str, str], dict[str, int]] | None = None,
    read: Collection[str] = (),
) -> tuple[list[str], dict[tuple[str, str], int]]:
    """The serving containers new since the last read (another ID; or started again, not by the
    watchdog, `acting` in a step, nor by Docker's restart policy), and how often Docker's policy
    restarted the others. On the nodes whose Docker events were `read`, from the starts by no one the
    watchdog knows (`starts`: per container, Docker's `policy`'s and an `other`'s); elsewhere from
    RestartCount, which Docker resets on every start through its API, the watchdog's own included."""
    new, restarted = [], {}
    for key, facts in known.items():
        was = before.get(key)
        if was is None:
            continue
        if facts.get("id") != was.get("id"):
            new.append(key[1])
            continue
        started_again = facts.get("started_at") != was.get("started_at") and not acting
        if key[0] in read:
            seen = (starts or {}).get(key) or {}
            if seen.get("policy"):
                restarted[key] = seen["policy"]
            # Started by someone else (`up`, an operator); or its start event was not read in time.
            if seen.get("other") or (started_again and not seen):
                new.append(key[1])
            continue
        count, earlier = facts.get("restarts"), was.get("restarts")
        if isinstance(count, int) and isinstance(earlier, int) and count > earlier:
            restarted[key] = count - earlier
        elif started_again:
            new.append(key[1])  # started by someone else than the watchdog (`up`, an operator)
    return new, restarted


def judged_restarts(settings: Settings, restarted: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Docker's own restarts the watchdog answers: any rank's under mp (the world is broken), else the
    head's containers' only."""
    if settings.executor != "mp":
        return {key: n for key, n in restarted.items() if key[0] == settings.head}
    return restarted


# ---- Docker's events: whose each one is, Docker's restarts, a stop someone else began -----------------


def signal_name(signal: object) -> str:
    """A `kill` event's signal (Docker 20.10 gives its number, `15`) by name: SIGTERM."""
    text = str(signal or "")
    return text if text.startswith("SIG") else SIGNALS.get(text, f"signal {text}" if text else "a signal")


def own_act(event: dict, own: Iterable[dict], now: float) -> dict | None:
    """The watchdog's or a memory guard's own stop or start (`DockerEvents.own`, oldest first: {node,
    name, action, by, begin, end: None while under way}) that made `event`, or None: someone else's or
    Docker's own. A `kill`, `die` or `stop` within one of its stops is the stop's; a `start` within one
    of its starts is that start's, one `start` per start (`claimed`: the event's id and time), so a
    crash Docker restarts a moment after the watchdog's own start is still Docker's."""
    action = event["action"]
    wanted = "start" if action == "start" else "stop" if action in STOPPING else None
    if wanted is None:
        return None
    mark = (event["id"], event["at"])
    for act in reversed(tuple(own)):
        if (act["node"], act["name"], act["action"]) != (event["node"], event["name"], wanted):
            continue
        end = act["end"] if act["end"] is not None else now
        if not act["begin"] - OWN_SLACK_S <= event["at"] <= end + OWN_SLACK_S:
            continue
        if wanted == "start" and act.get("claimed", mark) != mark:
            continue  # this start's own event was another one
        return act
    return None


def after_die(start: dict, kept: Iterable[dict]) -> bool:
    """Whether the container's last event before `start` (in `kept`, oldest first) was a `die`, with no
    `stop` by anyone since: Docker's restart policy started it again."""
    for event in reversed(tuple(kept)):
        if (event["node"], event["name"], event["id"]) != (start["node"], start["name"], start["id"]):
            continue
        if event["action"] in ("create", "start", "kill", "stop", "die"):
            return event["action"] == "die"
    return False


def begins_stand_back(event: dict, standing: Collection[tuple[str, str]]) -> bool:
    """A `kill` no one the watchdog knows sent (`by` None) to a container it does not yet stand back
    for: someone else began a stop (`pulumi up`'s delete, an operator). Not SIGKILL: that ends the
    container at once (`docker kill`, a crash's like), so there is no stop to wait out and the server
    is judged as after any crash."""
    return (
        event["action"] == "kill"
        and event.get("by") is None
        and (event["node"], event["name"]) not in standing
        and signal_name(event.get("signal")) != "SIGKILL"
    )


def stand_back_end(entry: dict, facts: dict, by: str | None, now: float) -> str | None:
    """How a stand-back `entry` ends at `now`, given its container's last facts and whose its `kill`
    turned out to be (`by`: a memory guard's trip is recorded once its stops are done): that owner's
    name; `destroy` when the container is gone or replaced; `bound` past its stop timeout plus a
    minute; None while it goes on."""
    if by is not None:
        return by
    if facts.get("state") == "missing" or facts.get("id", entry["id"]) != entry["id"]:
        return "destroy"
    if now >= entry["until"]:
        return "bound"
    return None


# ---- a recovery: its step, what it restarts, the budget, what holds it ----------------------------------


def restart_step(settings: Settings, step: health_wire.Step) -> health_wire.Step:
    """The step a recovery takes: under mp always the cluster (the ranks of one world live and die
    together)."""
    return health_wire.Step.RESTART_CLUSTER if settings.executor == "mp" else step


def restart_targets(settings: Settings, step: health_wire.Step) -> list[Target]:
    """What `step` starts, in order (stopped in the reverse order); under mp always the world."""
    if step is health_wire.Step.RESTART_SERVER and settings.executor != "mp":
        return [settings.server]
    return list(settings.cluster)


def in_window(settings: Settings, restarts: list[dict], now: float) -> list[dict]:
    """The restarts that count against the budget at `now` (within `window_s`)."""
    return [r for r in restarts if now - r["at"] < settings.window_s]


def budget_left(settings: Settings, restarts: list[dict], now: float) -> int:
    return max(settings.max_restarts - len(in_window(settings, restarts, now)), 0)


def spent_why(settings: Settings, reason: str, step: health_wire.Step) -> str:
    """Why the budget is spent (`spent.why` in /state)."""
    return (
        f"{settings.max_restarts} restarts in {settings.window_s:g} s spent; the server needed another "
        f"({step.value.replace('_', ' ')}, {reason})"
    )


def episode_from(settings: Settings, now: float, last_ready: float | None) -> float:
    """Since when a fault belongs to this failure: the last time the server answered (less one
    interval of slack for the clocks), within the budget's window. A fault the server answered
    after did not cause this."""
    since = now - settings.window_s
    if last_ready is not None:
        since = max(since, last_ready - settings.interval_s)
    return since


def short_of_memory(need: int | None, available: int | None) -> bool:
    """A node's MemAvailable does not reach its need (unknown counts as short; no need: never)."""
    return need is not None and (available is None or available < need)


def startup_rule(done: dict, util: float, available: int | None) -> dict:
    """vLLM's start-up rule on a node (`gpu_memory.startup_rule`) from its memory probe's answer
    (`World.memory_probe`); one that cannot judge (no report, an unforeseen shape) says why."""
    if done.get("error"):
        return {"checked": False, "why": str(done["error"])[:200]}
    try:
        return gpu_memory.startup_rule(done.get("report"), float(util), available)
    except Exception as exc:  # a report of an unforeseen shape: not judged, never held
        return {"checked": False, "why": f"the probe's report could not be read: {exc!r}"[:300]}


def memory_held(
    short: list[tuple[str, int | None, int, str | None]], refused: list[tuple[str, dict]]
) -> dict:
    """/state's `held` for a restart the memory wait gave up on: the first node short of MemAvailable
    (name, MemAvailable, need, why MemAvailable is unknown), else the first whose start-up rule refused
    (name, the rule)."""
    if short:
        name, available, need, why = short[0]
        message = (
            health_wire.held_message(name, available, need)
            if available is not None
            else f"{name}: MemAvailable unknown ({why}), {health_wire.gb(need)} needed: check the node"
        )
        return {"node": name, "available_bytes": available, "need_bytes": need, "message": message}
    name, rule = refused[0]
    return {
        "node": name,
        "available_bytes": rule.get("mem_available_bytes"),
        "need_bytes": None,
        "rule": rule,
        "message": gpu_memory.rule_message(name, rule),
    }
