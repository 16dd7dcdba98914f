"""What each tick of the watchdog checks, in its order: the serving containers (new ones, ones being
replaced, Docker's own restarts: `ServingWatch`) and Docker's events of them (whose each stop and
start is, Docker's restarts, a stop someone else began: `EventWatch`), the memory guards and the
agents' clocks (`GuardWatch`), and the server (/health, vLLM's /metrics, a completion:
`ServerChecks`). Each reads through the World, judges by the policy (`watchdog_policy`) and calls on
the recovery (`watchdog_recovery`) to act. A library of `watchdog`: standard library only; it
travels with the program to the node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from components.node_programs import cold_start, health_wire
from components.node_programs.watchdog_policy import (
    after_die,
    begins_stand_back,
    completion_deadline,
    engine_progress,
    grace_start,
    judged_restarts,
    own_act,
    parse_started_at,
    reason_for,
    recovery_due,
    replacing,
    serving_changes,
    signal_name,
    stand_back_end,
    track_progress,
)
from components.node_programs.watchdog_recovery import Recovery
from components.node_programs.watchdog_settings import Settings
from components.node_programs.watchdog_state import Status, log
from components.node_programs.watchdog_world import CALL_TIMEOUT_S, Probe, World

EVENTS_OVERLAP_S = 5.0  # each read of Docker's events goes back this far over the last (one logged late)


class EventWatch:
    """Docker's event log of the serving containers (issue 53), read every tick: each event marked with
    whose it is (the watchdog's own stops and starts, a memory guard's, or None: someone else's or
    Docker's), Docker's restart policy's starts counted one by one (RestartCount is reset on every
    start through Docker's API), `oom` events kept for the next diagnosis, and a stop someone else
    began (`pulumi up`'s delete with its 120 s grace, an operator) waited out, not fought."""

    def __init__(self, settings: Settings, world: World, clock: Callable[[], float], status: Status):
        self.s, self.world, self.clock, self.st = settings, world, clock, status

    def read(self, now: float) -> tuple[dict[tuple[str, str], dict[str, int]], list[str]]:
        """This tick's new events, digested: Docker's and others' starts per container (`policy`,
        `other`), and the stand-backs a removal or a start ended (what follows gets a fresh grace)."""
        self._learn_guard_stops()
        return self._digest(self._read_events(now))

    def _read_events(self, now: float) -> list[dict]:
        """Each node's Docker events of its serving containers since the last read (a little before
        it: an event logged late is not lost; the ones already seen are dropped), in the head's clock.
        A node whose events cannot be read is recorded in `error` and said once."""
        docker, fresh = self.st.docker, []
        for node in dict.fromkeys(t.node for t in self.s.serving()):
            skew = self.st.skew.get(node, 0.0)  # the node's clock minus the head's (0 on the head)
            since = max(docker.started, docker.read.get(node, docker.started) - EVENTS_OVERLAP_S)
            try:
                found, error = self.world.events(node, since + skew, now + skew)
            except Exception as exc:  # the World's own bound failed: not read, never a failed tick
                found, error = [], f"{type(exc).__name__}: {exc}"
            docker.read[node] = now
            if error is not None and docker.error.get(node) != error:
                log(
                    f"{node}: Docker's events could not be read ({error}): its restarts are counted from "
                    "RestartCount, which Docker resets on every start through its API"
                )
            docker.error[node] = error
            for raw in found if error is None else ():
                key = (node, raw.get("id"), raw.get("action"), raw.get("at"))
                if key in docker.keys or not isinstance(raw.get("at"), int | float):
                    continue
                docker.keys.append(key)
                fresh.append({**raw, "node": node, "at": float(raw["at"]) - skew})
        return sorted(fresh, key=lambda e: e["at"])

    def _digest(self, fresh: list[dict]) -> tuple[dict[tuple[str, str], dict[str, int]], list[str]]:
        """Keep the new events, each marked with whose it is (`by`). A start by no one the watchdog
        knows is Docker's restart policy's (`policy`: after a `die` with no `stop` by anyone) or
        someone else's (`other`: an operator, `pulumi up`); a `kill` by no one it knows begins a
        stand-back (`begins_stand_back`: not SIGKILL), which a removal or a start ends."""
        starts: dict[tuple[str, str], dict[str, int]] = {}
        ended: list[str] = []
        for event in fresh:
            key = (event["node"], event["name"])
            event["by"] = self._by(event)
            if begins_stand_back(event, self.st.standing):
                self._begin_stand_back(key, event)
            elif event["action"] in ("destroy", "start") and key in self.st.standing:
                ended.append(self._end_stand_back(key, event["action"], event["at"]))
            if event["action"] == "oom":
                # The kernel's OOM killer killed a process in it: the container may run on (a worker
                # process killed), and OOMKilled stays false unless its main process was the one.
                log(f"Docker's oom event: the kernel's OOM killer killed a process in {key[1]} on {key[0]}")
                self.st.docker.ooms.append(event)
            if event["action"] == "start" and event["by"] is None:
                kind = "policy" if after_die(event, self.st.docker.kept) else "other"
                count = starts.setdefault(key, {"policy": 0, "other": 0})
                count[kind] += 1
            self.st.docker.kept.append(event)
        return starts, ended

    def _by(self, event: dict) -> str | None:
        """Whose the event is (`own_act`): `watchdog` or `guard`, None otherwise. A start claims its act."""
        # A copy: the head's guard thread adds its stops meanwhile.
        act = own_act(event, tuple(self.st.docker.own), self.clock())
        if act is None:
            return None
        if event["action"] == "start":
            act.setdefault("claimed", (event["id"], event["at"]))
        return act["by"]

    def _learn_guard_stops(self) -> None:
        """An agent's memory guard stops its node's containers on its own: its last trip's stops (from
        its /containers answer) are the guard's, not someone else's."""
        docker = self.st.docker
        for node, report in self.world.memory_guards().items():
            last = report.get("last") if isinstance(report, dict) else None
            at = last.get("at") if isinstance(last, dict) and last.get("acted") else None
            if not isinstance(at, int | float) or (node, at) in docker.guards_learned:
                continue
            docker.guards_learned.append((node, at))
            begin, stopped = float(at) - self.st.skew.get(node, 0.0), list(last.get("stopped") or [])
            took = len(stopped) * (self.s.guard_stop_s + CALL_TIMEOUT_S)
            for name in stopped:
                stop = {"node": node, "name": name, "action": "stop", "by": "guard"}
                docker.own.append({**stop, "begin": begin, "end": begin + took})

    # -- a stop someone else sent (`pulumi up` replacing a container, an operator): stand back --

    def _begin_stand_back(self, key: tuple[str, str], kill: dict) -> None:
        """A serving container was sent a signal by someone else than the watchdog: `pulumi up`'s
        delete stops it with a 120 s grace, and it reads `running` until its process exits. Fighting
        that would spend a restart and start the old container again."""
        bound_s, signal = self.s.stand_back_s(*key), signal_name(kill.get("signal"))
        self.st.standing[key] = {
            "node": key[0],
            "name": key[1],
            "id": kill.get("id"),
            "since": kill["at"],
            "signal": signal,
            "until": kill["at"] + bound_s,
            "kill": kill,
        }
        self.st.stand_backs_total += 1
        log(
            f"{key[1]} on {key[0]} was sent {signal} by someone else than the watchdog (`pulumi up` "
            f"replacing it, or an operator): standing back until it is removed or started again, at most "
            f"{bound_s:g} s (its stop timeout plus a minute)"
        )

    def _end_stand_back(self, key: tuple[str, str], how: str, at: float) -> str:
        """End one stand-back (`how`: destroy, start, bound, or whose stop it was after all)."""
        entry = self.st.standing.pop(key)
        self.st.stand_backs.append(
            {"node": key[0], "name": key[1], "since": entry["since"], "ended": at, "how": how}
        )
        said = {
            "destroy": "was removed",
            "start": "was started again",
            "bound": f"was neither removed nor started again by {entry['until'] - entry['since']:g} s "
            "after the stop: judging it again",
        }.get(how, f"was the {how}'s own stop after all")
        said = f"{key[1]} on {key[0]}, stopped by someone else, {said}"
        log(said)
        return said

    def review(self, now: float, known: dict[tuple[str, str], dict]) -> None:
        """Each tick: a stop the memory guard turns out to have made (its trip is recorded once its
        stops are done) is no one else's; a container gone or replaced (its events not read) ends it;
        and the bound: the container's stop timeout plus a minute, then the watchdog judges again."""
        for key, entry in list(self.st.standing.items()):
            how = stand_back_end(entry, known.get(key) or {}, self._by(entry["kill"]), now)
            if how is not None:
                self._end_stand_back(key, how, now)

    def stand_back(self, now: float, restarted: dict[tuple[str, str], int]) -> None:
        """No verdict and no action while someone else stops a serving container (`starting`)."""
        if restarted:  # e.g. a rank whose peer `up` stops: the stop under way is not the watchdog's
            names = ", ".join(f"{name} on {node}" for node, name in sorted(restarted))
            log(f"Docker restarted {names} while another stops a serving container: not spent")
        entries = sorted(self.st.standing.values(), key=lambda e: e["since"])
        who = ", ".join(
            f"{e['name']} on {e['node']} ({e['signal']} {now - e['since']:.0f} s ago)" for e in entries
        )
        self.st.next_step = (
            f"wait: {who} is being stopped by someone else than the watchdog (`pulumi up` replacing it, or "
            f"an operator): no verdict and no action until it is removed or started again, at most "
            f"{max(e['until'] for e in entries) - now:.0f} s more"
        )
        self.st.failures, self.st.completion_failures, self.st.stall_since = 0, 0, None
        self.st.enter(health_wire.State.STARTING, now)


class ServingWatch:
    """The serving containers, read at each tick's start with their Docker events: while they are
    replaced, or new, no verdict (a fresh grace); while someone else stops one, none either (a
    stand-back); Docker's own restarts spend the budget as the watchdog's do."""

    def __init__(
        self, settings: Settings, world: World, status: Status, recovery: Recovery, events: EventWatch
    ):
        self.s, self.world, self.st, self.recovery, self.events = settings, world, status, recovery, events

    def observe(self, now: float) -> bool:
        """Read the serving containers and their Docker events. True when this tick ends here: they
        are being replaced or stopped by someone else (no verdict, no action), or Docker restarted one
        and the watchdog acted on it."""
        found = self._read_serving()
        # After the containers: an agent's memory guard report comes with its /containers answer.
        starts, ended = self.events.read(now)
        before = self.st.seen
        known = {key: facts for key, facts in found.items() if facts.get("state") != "unknown"}
        self.st.seen = {**before, **known}
        if not before:
            self._first_grace(found)
        self.events.review(now, known)
        if self.st.state is health_wire.State.BUDGET_SPENT:
            return False
        replaced = replacing(known)
        if replaced:
            self._fresh_grace(now, f"{', '.join(replaced)}: the serving containers are being replaced")
            return True
        acting, read = self.st.step is not None, self.st.docker.read_nodes()
        new, restarted = serving_changes(before, known, acting, starts, read)
        if new or ended:
            said = [f"new serving container(s) {', '.join(sorted(new))}"] if new else []
            self._fresh_grace(now, "; ".join(said + ended))
        if self.st.standing:
            self.events.stand_back(now, restarted)
            return True
        return False if new or ended else self._docker_restarts(now, restarted)

    def _read_serving(self) -> dict[tuple[str, str], dict]:
        """Each serving container's facts by (node, name); state `unknown` where its node did not say."""
        targets = self.s.serving()
        found: dict[tuple[str, str], dict] = {}
        for node in dict.fromkeys(t.node for t in targets):
            by_name = {c.get("name"): c for c in self.world.containers(node)}
            for t in (t for t in targets if t.node == node):
                found[(node, t.name)] = by_name.get(t.name) or {"name": t.name, "state": "unknown"}
        return found

    def _first_grace(self, found: dict[tuple[str, str], dict]) -> None:
        """The grace runs from the server container's start: a watchdog replaced (an upgrade) while
        the server has run for an hour gives it no new hour; after a boot both started together. After
        a reboot the server's container may not have been started again yet: its StartedAt is then the
        last boot's, and counts for nothing."""
        server = found.get((self.s.server.node, self.s.server.name)) or {}
        started, boot = parse_started_at(str(server.get("started_at") or "")), self.world.boot_time()
        self.st.grace_from = grace_start(self.st.grace_from, started, boot)

    def _fresh_grace(self, now: float, why: str) -> None:
        """A new server (or rank set), whatever made it: no verdict before it is ready or startup_s has
        passed, and no step of an earlier recovery goes on."""
        st = self.st
        said = f"wait: {why}; no verdict before it is ready or {self.s.startup_s:g} s have passed"
        if said != st.next_step:
            log(said)
        st.grace_from, st.ever_ready, st.failures, st.completion_failures = now, False, 0, 0
        st.stall_since, st.progress, st.step, st.pending, st.held = None, None, None, [], None
        st.next_step = said
        st.enter(health_wire.State.STARTING, now)

    def _docker_restarts(self, now: float, restarted: dict[tuple[str, str], int]) -> bool:
        """Docker's own restart policy (`unless-stopped`) restarted a serving container at once, with no
        memory check. Under mp the watchdog restarts the world (a rank cannot rejoin the others): one
        restart of the budget. Under Ray each restart of the head's containers spends one, as the
        watchdog's own restarts do (the one that finds the budget spent stops the cluster), and the
        server gets `ready_s` to be ready. True when the tick ends here."""
        restarted = judged_restarts(self.s, restarted)
        if not restarted:
            return False
        names = ", ".join(f"{name} on {node}" for node, name in sorted(restarted))
        log(f"Docker restarted {names} {sum(restarted.values())} time(s) on its own")
        mp = self.s.executor == "mp"
        if mp and self.st.step in (health_wire.Step.DIAGNOSE, health_wire.Step.MEMORY_WAIT):
            # The watchdog has stopped the world and not yet started it again (its stop broke the world:
            # a rank that lost its peers crashed and Docker's policy restarted it): part of that
            # recovery, which starts every rank again; its diagnosis and its one restart of the budget
            # stand. Once it started the world, a restart is a crash again, counted as one.
            log(f"part of the world restart under way ({self.st.reason}): not a recovery of its own")
            return False
        report = self.s.mode == health_wire.Mode.REPORT.value
        if mp and not report:
            self.recovery.recover(now, "docker_restart", health_wire.Step.RESTART_CLUSTER)
            return True
        for _ in range(sum(restarted.values())):
            if not report and self.recovery.budget_left(now) <= 0:
                self.st.reason = "docker_restart"
                self.st.diagnosis = self.recovery.diagnose(now, "docker_restart")
                self.recovery.spend(now, "docker_restart", health_wire.Step.RESTART_SERVER)
                return True
            self.recovery.record_restart(now, "docker_restart", health_wire.Step.RESTART_SERVER)
        if report:
            if mp:
                self.recovery.recover(now, "docker_restart", health_wire.Step.RESTART_CLUSTER)
            return False
        self.st.reason, self.st.step = "docker_restart", health_wire.Step.RESTART_SERVER
        self.st.step_deadline, self.st.completion_failures = now + self.s.ready_s, 0
        self.st.next_step = f"Docker restarted {names}: waiting up to {self.s.ready_s:g} s for ready"
        self.st.enter(health_wire.State.RECOVERING, now)
        return False


class GuardWatch:
    """The memory guards: the head's own (this program's, read every second in a thread and at each
    tick) and each agent's (read with its containers). A trip breaks the world, so each is answered
    with a cluster restart within the budget. Also each agent's clock, which its signatures need."""

    def __init__(self, settings: Settings, world: World, status: Status, recovery: Recovery):
        self.s, self.world, self.st, self.recovery = settings, world, status, recovery
        self.guard = health_wire.MemoryGuard(
            settings.head,
            settings.memory_floor_bytes,
            settings.memory_floor_s,
            settings.mode == health_wire.Mode.ENFORCE.value,
            lambda: world.mem_available(settings.head),
            self._head_running,
            self._guard_stop,
        )
        self.seen: dict[str, int] = {settings.head: 0}  # each node's guard trips already answered

    def _head_running(self) -> list[str]:
        """The head's serving containers that run, in stop order (the reverse of the start order)."""
        running = {c.get("name") for c in self.world.containers(self.s.head) if c.get("state") == "running"}
        return [t.name for t in reversed(self.s.serving()) if t.node == self.s.head and t.name in running]

    def _guard_stop(self, name: str) -> dict:
        target = next(t for t in self.s.serving() if t.node == self.s.head and t.name == name)
        # The guard's own short bound, not the container's grace: SIGKILL after guard_stop_s.
        bounded = replace(target, stop_timeout_s=self.s.guard_stop_s)
        done = self.recovery.act("stop", bounded, "guard")
        found = next((c for c in self.world.containers(target.node) if c.get("name") == name), {})
        done = health_wire.guard_stopped(done, found, self.s.guard_stop_s)
        log(f"memory guard: stop {name} on {target.node}: {health_wire.guard_stop_said(done)}")
        return done

    def answer_trips(self, now: float) -> bool:
        """A node's guard stopped its serving containers (or would have, under report): the world is
        broken (a Ray node or a rank gone), so the answer is a cluster restart, memory-checked, one of
        the budget (reason `memory_floor`); a spent budget stops everything. True when the tick ends."""
        tripped = self._new_trips()
        for event in tripped:
            log(f"memory guard: {event.get('message')}")
        busy = (
            self.st.state in (health_wire.State.BUDGET_SPENT, health_wire.State.MEMORY_HELD)
            or self.st.step is health_wire.Step.MEMORY_WAIT
        )
        if not tripped or busy:
            return False
        self.recovery.recover(now, "memory_floor", health_wire.Step.RESTART_CLUSTER, tripped=tripped[0])
        return True

    def _new_trips(self) -> list[dict]:
        """Each guard's report read (MemAvailable, its last trip): the trips since the last read, each
        node's last one. An agent's trips before this watchdog first saw it are shown only."""
        tripped = []
        for node, report in {self.s.head: self.guard.report(), **self.world.memory_guards()}.items():
            if isinstance(report.get("available_bytes"), int):
                self.st.mem[node] = report["available_bytes"]
            trips, seen = report.get("trips"), self.seen.get(node)
            if not isinstance(trips, int):
                continue
            self.seen[node] = trips
            if report.get("last"):
                self.st.memory_guard[node] = report["last"]
            if seen is not None and trips > seen and report.get("last"):
                self.st.guard_trips[node] = self.st.guard_trips.get(node, 0) + trips - seen
                tripped.append(report["last"])
        return tripped

    def read_skew(self) -> None:
        """Each agent's clock against the head's: beyond the signature window every request is refused."""
        skew = self.world.agent_clock_skew()
        window = health_wire.SIGNATURE_WINDOW_S
        for node, value in skew.items():
            if abs(value) > window and abs(self.st.skew.get(node, 0.0)) <= window:
                log(health_wire.skew_message(node, value))
        self.st.skew = skew


class ServerChecks:
    """The server, once the containers and guards gave no verdict: /health (liveness), and while it
    serves vLLM's /metrics (a stall) and a one-token completion (a hang /health hides); failures in a
    row call for a recovery, and a restart not ready within `ready_s` for a cluster restart."""

    def __init__(
        self, settings: Settings, world: World, clock: Callable[[], float], status: Status, recovery: Recovery
    ):
        self.s, self.world, self.clock, self.st, self.recovery = settings, world, clock, status, recovery
        self.probes = 0

    def check(self) -> None:
        """One /health probe and what follows from it."""
        st = self.st
        probe = self._probe()
        # Whatever follows is decided now, after the probe's wait (up to its deadline), not at the
        # tick's start: a recorded time is the decision's.
        now = self.clock()
        if probe.ok:
            self._answered(now, probe)
            return
        if st.state is health_wire.State.MEMORY_HELD:
            return  # stopped acting: an operator frees the memory (reboots the node)
        if st.step in (health_wire.Step.RESTART_SERVER, health_wire.Step.RESTART_CLUSTER):
            if now >= st.step_deadline:
                log(f"not ready {self.s.ready_s:g} s after {st.step.value}: restarting the cluster")
                self.recovery.recover(now, "not_ready", health_wire.Step.RESTART_CLUSTER)
            return
        if not st.ever_ready and now - st.grace_from < self.s.startup_s:
            st.enter(health_wire.State.STARTING, now)
            return
        st.failures += 1
        self._failed(now, st.failures, reason_for(probe.kind), "probes")

    def _failed(self, now: float, count: int, reason: str, what: str) -> None:
        """`count` failed `what` in a row: a recovery at `failures` (report mode: one per run)."""
        self.st.enter(health_wire.State.FAILING, now)
        if count < self.s.failures:
            self.st.next_step = f"{count} of {self.s.failures} failed {what} in a row before a recovery"
        elif recovery_due(self.s, count):
            self.recovery.recover(now, reason, health_wire.Step.RESTART_SERVER)

    def _probe(self) -> Probe:
        self.probes += 1
        probe = self.world.probe_health(self.s.deadline_s)
        self.st.last_probe = probe
        if not probe.ok:
            log(f"probe failed ({probe.kind}: {probe.detail})")
        return probe

    def _healthy(self, now: float) -> None:
        self.st.last_ready, self.st.next_step = now, "nothing to do"
        self.st.enter(health_wire.State.HEALTHY, now)
        self._measure_start()

    def _measure_start(self) -> None:
        """Once per start of the server (its container's `started_at`), when it first answers: the
        start's milestones from vLLM's log (weights loaded, engine and API ready). The first
        completion is the readiness gate's to time: the watchdog's completions run on their own
        schedule, so it records none."""
        server = self.st.seen.get((self.s.server.node, self.s.server.name)) or {}
        text = str(server.get("started_at") or "")
        started = cold_start.parse_stamp(text)
        if started is None or (self.st.cold_start or {}).get("started_at") == round(started, 3):
            return
        try:
            # A start's milestones fall within the wait any start is given: the log after it is not read.
            window = max(self.s.startup_s, self.s.ready_s) + CALL_TIMEOUT_S
            lines = self.world.start_lines(self.s.server, started, started + window)
        except OSError as exc:
            self.st.cold_start = {"started_at": round(started, 3), "error": str(exc)}
            return
        self.st.cold_start = cold_start.cold_start(text, lines)
        log(f"server start {text}: {cold_start.summary(self.st.cold_start)}")

    def _answered(self, now: float, probe: Probe) -> None:
        """/health answered: the server is ready (the first time, or after a restart); while it serves,
        /health proves the API server alive only, and the engine's progress and completions decide."""
        st = self.st
        st.failures = 0
        if not st.ever_ready or st.step is not None or st.state is health_wire.State.MEMORY_HELD:
            log(f"the server is ready ({probe.latency_s:.2f} s)")
            st.step, st.held, st.ever_ready = None, None, True
            st.completion_failures, st.stall_since, st.progress = 0, None, None
            self._healthy(now)
            return
        before = self._progress(now)
        if st.stall_since is not None and now - st.stall_since >= self.s.stall_s:
            log(
                f"no token computed for {now - st.stall_since:.0f} s with "
                f"{st.progress and st.progress['running']:g} request(s) running and "
                f"{st.progress and st.progress['waiting']:g} waiting: the engine is hung"
            )
            st.stall_since = None  # report mode: the next verdict after another stall_s
            self.recovery.recover(now, "stall", health_wire.Step.RESTART_SERVER)
            return
        deadline_s = completion_deadline(self.s, before, st.completion_failures, self.probes)
        if deadline_s is None:
            self._healthy(now)
            return
        self._completion(before, deadline_s)

    def _completion(self, before: tuple[float, float, float] | None, deadline_s: float) -> None:
        """One chat completion: due on every probe while the engine is idle (its short deadline: an idle
        engine answers one token at once), else every `completion_every` probes, and on every probe
        after one failed. One that timed out while the engine computed tokens (prompt or generated) is
        an overloaded engine, not a hung one."""
        probe = self.world.probe_completion(deadline_s)
        self.st.last_probe = probe
        now = self.clock()  # after the completion's wait (up to its deadline): the decision's time
        if probe.ok:
            self.st.completion_failures, self.st.last_ttft = 0, probe.latency_s
            self._healthy(now)
            return
        if probe.kind == "timeout" and before is not None:
            after = self._progress(now)
            if after is not None and after[2] > before[2]:
                self.st.next_step = "a completion timed out while the engine computed tokens: busy, not hung"
                log(self.st.next_step)
                return
        self.st.completion_failures += 1
        log(f"completion failed ({probe.kind}: {probe.detail}) while /health answers")
        self._failed(now, self.st.completion_failures, reason_for(probe.kind), "completions")

    def _progress(self, now: float) -> tuple[float, float, float] | None:
        """vLLM's /metrics: (requests running, waiting, tokens computed), and since when requests have
        been in the engine without a token computed (`stall_since`); None when /metrics does not say."""
        text = self.world.probe_metrics(self.s.deadline_s)
        found = engine_progress(text) if text else None
        st = self.st
        st.stall_since, st.progress = track_progress(found, st.progress, st.stall_since, now)
        return found
