"""HealthSecret's one step that is not a pure function of its inputs: drawing the secret. It touches
no node; an update keeps the recorded secret (`plan.kept_outputs`), refresh reads the state alone and
delete removes nothing (the SDK's read and delete), so `ensure` is the only verb."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from components.health_secret.plan import SECRET_BYTES, SECRET_KEY, UPDATE_KEYS


def ensure(props: Mapping[str, Any], olds: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Create's outputs: the inputs recorded in place and a new random secret (`SECRET_BYTES`, hex)."""
    return {**{k: props.get(k) for k in UPDATE_KEYS}, SECRET_KEY: secrets.token_hex(SECRET_BYTES)}
