"""The `health` section: the watchdog on the head and its agents on the other nodes."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from components.config.fields import CheckMode, _check_host, _CrossFieldErrors, _Model


class HealthConfig(_Model):
    """The watchdog on the head and its agents on the other nodes (docs/health.md)."""

    # What the watchdog (components/health) does once `up` has finished: enforce: probe the server,
    # and recover a hung or crashed one in steps, memory-checked, within the budget; report: probe
    # and record what it would do, never act; off: no watchdog, no agents.
    mode: CheckMode = CheckMode.ENFORCE
    # Seconds between /health probes, and a probe's deadline.
    interval_s: float = Field(default=10, gt=0, le=3600)
    deadline_s: float = Field(default=5, gt=0, le=600)
    # While vLLM's /metrics says the engine is idle (no request running or waiting), every probe is also a
    # one-token chat completion within idle_completion_deadline_s: a hang /health hides is found within
    # a minute at the defaults. Under load every Nth probe is, within completion_deadline_s (and the
    # stall rule below judges the engine by its token counters).
    completion_every: int = Field(default=6, ge=1, le=10_000)
    completion_deadline_s: float = Field(default=60, gt=0, le=3600)
    idle_completion_deadline_s: float = Field(default=10, gt=0, le=600)
    # Consecutive failed probes before a recovery (/health probes, and completions counted on their own).
    failures: int = Field(default=3, ge=1, le=1000)
    # Requests running or waiting in the engine (vLLM's /metrics) while no token is counted (prompt or
    # generated) for this long is a hang. Longer than the longest prefill expected.
    stall_s: float = Field(default=300, gt=0, le=86400)
    # No verdict before the server was first ready or this long since the containers started (a
    # first boot can spend tens of minutes in JIT tuning).
    startup_s: float = Field(default=3600, ge=0)
    # After a restart, how long to wait for ready before the next step.
    ready_s: float = Field(default=1800, gt=0)
    # How long MemAvailable may take to reach the memory fit's need before a restart.
    memory_wait_s: float = Field(default=300, ge=0)
    # The memory guard (docs/health.md): MemAvailable below memory_floor_gb (GB, 10^9) for memory_floor_s
    # on a node stops the stack's serving containers there, once, before the kernel's OOM killer or a
    # wedged unified-memory node does; one restart of the budget. 0 turns it off.
    memory_floor_gb: float = Field(default=2, ge=0, le=1024)
    memory_floor_s: float = Field(default=5, gt=0, le=3600)
    # How long a container the guard stops gets to exit on SIGTERM before Docker sends SIGKILL: short,
    # because a node short of memory is when the OOM killer or a wedge arrives (not the containers'
    # own 120 s grace, which `pulumi up` and the watchdog's restarts use).
    guard_stop_s: int = Field(default=10, ge=1, le=120)
    # Let the watchdog and the agents read the kernel's log (/dev/kmsg and CAP_SYSLOG) so a diagnosis
    # names the kernel's OOM kills and NVRM Xids; off: Docker's OOMKilled only (docs/health.md).
    kernel_log: bool = False
    # At most this many restarts per window; then everything is stopped for an operator.
    max_restarts: int = Field(default=3, ge=0, le=1000)
    window_s: float = Field(default=3600, gt=0)
    # The watchdog's /metrics and /state, on metrics_host (default: the head's fabric address).
    port: int = Field(default=29592, ge=1024, le=65535)
    metrics_host: str | None = None
    # Each agent listens on its node's fabric address and this port.
    agent_port: int = Field(default=29593, ge=1024, le=65535)

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_off(cls, v: Any) -> Any:
        # YAML 1.1 (Pulumi's stack files) reads an unquoted `off` as false.
        return "off" if v is False else v

    @field_validator("metrics_host")
    @classmethod
    def _host(cls, v: str | None) -> str | None:
        return None if v is None else _check_host(v)

    @model_validator(mode="after")
    def _keys(self) -> HealthConfig:
        problems = []
        if self.mode is CheckMode.OFF:
            problems += [
                (f"health.{key}", "is not read with health.mode off (no watchdog runs): remove it, or set "
                 "health.mode to enforce or report")
                for key in sorted(self.model_fields_set - {"mode"})
            ]  # fmt: skip
        if self.deadline_s >= self.interval_s:
            problems.append(
                ("health.deadline_s", f"{self.deadline_s:g} s is not below health.interval_s "
                 f"({self.interval_s:g} s): a probe must end before the next one; lower it")
            )  # fmt: skip
        if self.stall_s <= self.interval_s:
            problems.append(
                ("health.stall_s", f"{self.stall_s:g} s is not above health.interval_s "
                 f"({self.interval_s:g} s): a stall is seen between two probes; raise it")
            )  # fmt: skip
        if self.port == self.agent_port:
            problems.append(
                ("health.agent_port", f"{self.agent_port} is health.port too: choose another port")
            )
        if problems:
            raise _CrossFieldErrors(problems)
        return self
