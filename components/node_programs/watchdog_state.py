"""What survives the watchdog's container (`Persisted`: state.json in the state volume), and its log.
A library of `watchdog`: standard library only; it travels with the program to the node.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

RESTART_KEEP = 50  # restarts kept in /state's history (the window's count is what the budget reads)


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} watchdog: {message}", flush=True)


@dataclass
class Persisted:
    """What survives the watchdog's container (state.json in the state volume)."""

    restarts: list[dict] = field(default_factory=list)  # {at, reason, step}, newest last
    restarts_total: dict[str, int] = field(default_factory=dict)
    spent: dict | None = None  # {at, why}
    stopped: list[dict] = field(default_factory=list)  # {node, name} the watchdog stopped when spent
    budget_resets: list[dict] = field(default_factory=list)  # {at, why}

    @staticmethod
    def load(raw: dict | None) -> Persisted:
        raw = raw if isinstance(raw, dict) else {}
        return Persisted(
            restarts=list(raw.get("restarts") or []),
            restarts_total=dict(raw.get("restarts_total") or {}),
            spent=raw.get("spent"),
            stopped=list(raw.get("stopped") or []),
            budget_resets=list(raw.get("budget_resets") or [])[-RESTART_KEEP:],
        )

    def as_dict(self) -> dict:
        return {
            "restarts": self.restarts[-RESTART_KEEP:],
            "restarts_total": self.restarts_total,
            "spent": self.spent,
            "stopped": self.stopped,
            "budget_resets": self.budget_resets[-RESTART_KEEP:],
        }


def load_saved(path: str) -> dict | None:
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log(f"state file {path} unreadable ({exc}): starting from an empty history")
        return None


def saver(path: str) -> Callable[[dict], None]:
    def save(data: dict) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as handle:
            json.dump(data, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    return save
