"""The watchdog's policy (components/node_programs/watchdog_policy.py) as tables: observations in, a
verdict out, no World and no clock. The tick-by-tick behaviour is tests/unit/test_watchdog.py's."""

from __future__ import annotations

import pytest

from components.node_programs import health_wire
from components.node_programs.watchdog_policy import (
    after_die,
    begins_stand_back,
    completion_deadline,
    grace_start,
    memory_held,
    own_act,
    recovery_due,
    restart_targets,
    serving_changes,
    signal_name,
    stand_back_end,
    startup_rule,
    track_progress,
)
from tests.unit.test_watchdog import settings

# settings(): failures 3, a completion every 6th probe within 60 s (idle engine: 10 s).

GB = 10**9


@pytest.mark.parametrize(
    ("mode", "count", "due"),
    [("enforce", 3, True), ("enforce", 4, True), ("report", 3, True), ("report", 4, False)],
)
def test_a_recovery_is_due_at_failures_and_past_it_only_where_the_watchdog_acts(mode, count, due):
    assert recovery_due(settings(mode=mode), count) is due


@pytest.mark.parametrize(
    ("before", "completion_failures", "probes", "deadline"),
    [
        ((0.0, 0.0, 50.0), 0, 1, 10),  # idle: every probe, the short deadline
        ((1.0, 0.0, 50.0), 0, 1, None),  # busy: not this probe
        ((1.0, 0.0, 50.0), 0, 6, 60),  # busy: every 6th probe
        ((0.0, 2.0, 50.0), 1, 1, 60),  # after a failed one: every probe; waiting requests: not idle
        (None, 0, 12, 60),  # /metrics unread: every 6th probe
        (None, 0, 13, None),
    ],
)
def test_when_a_completion_is_due_and_its_deadline(before, completion_failures, probes, deadline):
    assert completion_deadline(settings(), before, completion_failures, probes) == deadline


@pytest.mark.parametrize(
    ("found", "last_tokens", "stall_since", "expected_since"),
    [
        (None, 5.0, 100.0, None),  # /metrics says nothing: no stall known
        ((0.0, 0.0, 5.0), 5.0, 100.0, None),  # nothing in the engine: no stall
        ((1.0, 0.0, 5.0), 5.0, 100.0, 100.0),  # requests in, no token since: the stall goes on
        ((1.0, 0.0, 6.0), 5.0, 100.0, 200.0),  # a token computed: it starts again now
        ((1.0, 0.0, 5.0), None, None, 200.0),  # first figures: from now
    ],
)
def test_the_stall_is_tracked_from_the_last_token_computed(found, last_tokens, stall_since, expected_since):
    last = None if last_tokens is None else {"tokens": last_tokens}
    since, progress = track_progress(found, last, stall_since, 200.0)
    assert since == expected_since
    assert progress is None if found is None else progress["stalled_s"] == 200.0 - (since or 200.0)


@pytest.mark.parametrize(
    ("now", "acting", "new", "restarted"),
    [
        ({"id": "b", "restarts": 0, "started_at": "t1"}, False, ["c"], {}),  # another container
        ({"id": "a", "restarts": 2, "started_at": "t2"}, False, [], {("n", "c"): 2}),  # Docker's policy
        ({"id": "a", "restarts": 0, "started_at": "t2"}, False, ["c"], {}),  # started by `up`
        ({"id": "a", "restarts": 0, "started_at": "t2"}, True, [], {}),  # started by the watchdog
        ({"id": "a", "restarts": 0, "started_at": "t1"}, False, [], {}),
    ],
)
def test_a_serving_container_s_change_is_new_or_docker_s_restart(now, acting, new, restarted):
    before = {("n", "c"): {"id": "a", "restarts": 0, "started_at": "t1"}}
    assert serving_changes(before, {("n", "c"): now}, acting) == (new, restarted)


@pytest.mark.parametrize(
    ("started", "boot", "expected"),
    [
        (500.0, None, 500.0),
        (500.0, 400.0, 500.0),
        (500.0, 600.0, 1000.0),
        (None, None, 1000.0),
        (1500.0, None, 1000.0),
    ],
)
def test_the_grace_runs_from_a_server_start_in_this_boot(started, boot, expected):
    assert grace_start(1000.0, started, boot) == expected


def test_a_server_restart_restarts_the_server_under_ray_and_the_world_under_mp():
    ray, mp = settings(), settings("mp")
    assert restart_targets(ray, health_wire.Step.RESTART_SERVER) == [ray.server]
    assert restart_targets(ray, health_wire.Step.RESTART_CLUSTER) == list(ray.cluster)
    assert restart_targets(mp, health_wire.Step.RESTART_SERVER) == list(mp.cluster)


def test_a_held_restart_names_the_first_node_short_of_memory_else_the_rule_that_refused():
    held = memory_held([("spark-2", 3 * GB, 50 * GB, None)], [])
    assert held["node"] == "spark-2" and held["need_bytes"] == 50 * GB and "spark-2" in held["message"]
    unknown = memory_held([("spark-2", None, 50 * GB, "unreadable")], [])["message"]
    assert "MemAvailable unknown (unreadable)" in unknown
    rule = startup_rule(
        {"report": {"cuda": True, "cuda_total_bytes": 128 * GB, "cuda_free_bytes": 20 * GB}}, 0.8, None
    )
    assert rule["checked"] and not rule["ok"]
    held = memory_held([], [("spark-1", rule)])
    assert held["node"] == "spark-1" and held["rule"] is rule and held["need_bytes"] is None


@pytest.mark.parametrize(
    ("done", "why"),
    [
        ({"report": None, "error": "docker failed"}, "docker failed"),
        ({"report": "not a dict", "error": None}, "the probe's report could not be read"),
        ({"report": None, "error": None}, "no report from the probe"),
    ],
)
def test_a_probe_that_cannot_judge_the_start_up_rule_says_why(done, why):
    rule = startup_rule(done, 0.8, None)
    assert rule["checked"] is False and rule["why"].startswith(why)


# ---- Docker's events (issue 53) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "starts", "new", "restarted"),
    [
        # RestartCount reads 0 (Docker reset it on the watchdog's own start): the events count.
        ({"id": "a", "restarts": 0, "started_at": "t2"}, {"policy": 2, "other": 0}, [], {("n", "c"): 2}),
        ({"id": "a", "restarts": 5, "started_at": "t2"}, {}, ["c"], {}),  # no start event: not the count
        ({"id": "a", "restarts": 0, "started_at": "t2"}, {"policy": 0, "other": 1}, ["c"], {}),  # `up`
        ({"id": "a", "restarts": 0, "started_at": "t1"}, {}, [], {}),
        ({"id": "b", "restarts": 0, "started_at": "t2"}, {"policy": 1, "other": 0}, ["c"], {}),  # another
    ],
)
def test_where_docker_s_events_were_read_its_restarts_are_counted_from_them(now, starts, new, restarted):
    before = {("n", "c"): {"id": "a", "restarts": 0, "started_at": "t1"}}
    found = serving_changes(before, {("n", "c"): now}, False, {("n", "c"): starts}, {"n"})
    assert found == (new, restarted)
    # Where they were not read, RestartCount decides as before.
    assert serving_changes(before, {("n", "c"): now}, False, {("n", "c"): starts}, {"other-node"}) == (
        serving_changes(before, {("n", "c"): now}, False)
    )


@pytest.mark.parametrize(
    ("signal", "name"),
    [("15", "SIGTERM"), ("9", "SIGKILL"), ("SIGINT", "SIGINT"), ("10", "signal 10"), (None, "a signal")],
)
def test_a_kill_event_s_signal_is_named(signal, name):
    assert signal_name(signal) == name


def kill(signal: str | None = "15", by: str | None = None, action: str = "kill") -> dict:
    return {"node": "n", "name": "c", "id": "a", "at": 100.0, "action": action, "signal": signal, "by": by}


@pytest.mark.parametrize(
    ("event", "standing", "begins"),
    [
        (kill("15"), (), True),  # `up`'s delete: SIGTERM, a grace of 120 s
        (kill("2"), (), True),
        (kill("9"), (), False),  # `docker kill`: over at once, nothing to wait out
        (kill("SIGKILL"), (), False),
        (kill("15", by="watchdog"), (), False),  # its own stop
        (kill("15", by="guard"), (), False),
        (kill("15"), (("n", "c"),), False),  # already standing back
        (kill(None, action="die"), (), False),
    ],
)
def test_only_a_kill_by_someone_else_that_is_not_sigkill_begins_a_stand_back(event, standing, begins):
    assert begins_stand_back(event, standing) is begins


def act(action: str, begin: float, end: float | None, by: str = "watchdog") -> dict:
    return {"node": "n", "name": "c", "action": action, "by": by, "begin": begin, "end": end}


@pytest.mark.parametrize(
    ("event_action", "at", "acts", "whose"),
    [
        ("kill", 101.0, [act("stop", 100.0, 130.0)], "watchdog"),
        ("die", 131.5, [act("stop", 100.0, 130.0)], "watchdog"),  # within the slack
        ("stop", 133.0, [act("stop", 100.0, 130.0)], None),  # past it
        ("kill", 101.0, [act("stop", 100.0, None, "guard")], "guard"),  # under way (now: 200)
        ("start", 101.0, [act("stop", 100.0, 130.0)], None),  # a start is not a stop's
        ("start", 101.0, [act("start", 100.0, 102.0)], "watchdog"),
        ("oom", 101.0, [act("stop", 100.0, 130.0)], None),  # no act makes an oom
    ],
)
def test_an_event_is_the_act_s_that_made_it_within_its_time(event_action, at, acts, whose):
    event = {"node": "n", "name": "c", "id": "a", "at": at, "action": event_action}
    found = own_act(event, acts, 200.0)
    assert (found and found["by"]) == whose


def test_a_start_claims_one_start_event_only():
    """A crash Docker restarts a moment after the watchdog's own start is Docker's, not the start's."""
    start = act("start", 100.0, 102.0)
    first = {"node": "n", "name": "c", "id": "a", "at": 101.0, "action": "start"}
    assert own_act(first, [start], 200.0) is start
    start["claimed"] = (first["id"], first["at"])
    assert own_act(first, [start], 200.0) is start  # read again (the overlap): the same claim
    again = {**first, "at": 102.5}
    assert own_act(again, [start], 200.0) is None


def event(action: str, at: float, cid: str = "a") -> dict:
    return {"node": "n", "name": "c", "id": cid, "at": at, "action": action}


@pytest.mark.parametrize(
    ("kept", "policy"),
    [
        ([event("start", 1), event("die", 2)], True),  # a crash: Docker's restart policy
        ([event("die", 2), event("oom", 2.5)], True),  # an oom is no step of a stop or a start
        ([event("kill", 1), event("die", 2), event("stop", 3)], False),  # stopped: someone started it
        ([event("start", 1)], False),
        ([event("die", 2, cid="b")], False),  # another container's
        ([], False),
    ],
)
def test_a_start_after_a_die_with_no_stop_between_is_docker_s_restart_policy(kept, policy):
    assert after_die(event("start", 10), kept) is policy


@pytest.mark.parametrize(
    ("facts", "by", "now", "how"),
    [
        ({"state": "running", "id": "a"}, None, 150.0, None),  # still stopping: stand back on
        ({"state": "running", "id": "a"}, "guard", 150.0, "guard"),  # the guard's stop after all
        ({"state": "missing"}, None, 150.0, "destroy"),
        ({"state": "running", "id": "b"}, None, 150.0, "destroy"),  # replaced, its events not read
        ({"state": "exited", "id": "a"}, None, 280.0, "bound"),  # its stop timeout plus a minute
        ({}, None, 150.0, None),  # its node did not say
    ],
)
def test_a_stand_back_ends_by_its_owner_a_removal_or_its_bound(facts, by, now, how):
    entry = {"id": "a", "since": 100.0, "until": 280.0}
    assert stand_back_end(entry, facts, by, now) == how
