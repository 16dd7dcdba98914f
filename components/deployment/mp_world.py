"""Executor mp: every rank's environment carries the world's digest (WORLD_ENV, components/mp_executor.py)
so that a change to any rank replaces every rank. Values only: the digest's key is the caller's resource.
"""

from __future__ import annotations

from typing import Any

import pulumi

from components.containers import ContainerSpec
from components.deployment.docker_args import present_secrets
from components.mp_executor import WORLD_ENV, rank_identity, world_digest

# By node, in rank order: a rank's spec and its environment (None: the spec's own).
RankSpecs = dict[str, tuple[ContainerSpec, pulumi.Input[list[str]] | None]]


def identity(
    spec: ContainerSpec,
    env_list: pulumi.Input[list[str]] | None,
    revision: pulumi.Output[str] | None,
    secrets: dict[str, Any],
) -> pulumi.Output[dict]:
    """One rank's container as it runs (`rank_identity`): its image, environment, command with the
    pinned revision, and the secrets set."""
    present = present_secrets(spec.secret_env, secrets)
    names = sorted(present)
    return pulumi.Output.all(
        spec.image,
        spec.env_list() if env_list is None else env_list,
        revision,
        *(present[n] for n in names),
    ).apply(
        lambda v: rank_identity(
            spec,
            v[0],
            v[1],
            [*spec.command, *(["--revision", v[2]] if v[2] is not None else [])],
            dict(zip(names, v[3:], strict=True)),
        )
    )


def with_world(
    specs: RankSpecs,
    key: pulumi.Output[str],
    revision: pulumi.Output[str] | None,
    secrets: dict[str, Any],
) -> dict[str, tuple[ContainerSpec, pulumi.Output[list[str]]]]:
    """Every rank's spec, its environment given `WORLD_ENV`: the digest, keyed by `key`, over every
    rank's identity in rank order."""
    world = pulumi.Output.all(
        key, *(identity(spec, env_list, revision, secrets) for spec, env_list in specs.values())
    ).apply(lambda v: world_digest(v[1:], v[0]))
    return {
        node: (
            spec,
            pulumi.Output.all(spec.env_list() if env_list is None else env_list, world).apply(
                lambda v: [*v[0], f"{WORLD_ENV}={v[1]}"]
            ),
        )
        for node, (spec, env_list) in specs.items()
    }
