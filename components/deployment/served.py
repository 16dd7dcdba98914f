"""What the cluster serves, pinned to the checkpoint's commit: layout's values (the server's argv,
each headless rank's under executor mp, what the readiness gate records as deployed) with the commit
the head's checkpoint resolves. No resource is declared here, and no config section is read.
"""

from __future__ import annotations

from typing import Any

import pulumi

from components import layout
from components.config import StackConfig


def deployed(cfg: StackConfig, ref: str, revision: pulumi.Output[str] | None) -> pulumi.Input[dict]:
    """What the gate records as served once it passes: the image and the checkpoint's commit, each
    with the config line that selects it again (`layout.deployed`)."""
    record = layout.deployed(cfg, ref)
    if revision is None:
        return record
    return revision.apply(lambda sha: layout.deployed_revision(record, sha))


def server_argv(cfg: StackConfig, revision: pulumi.Output[str] | None) -> pulumi.Input[list[str]]:
    """The server's final argument list, `--revision` the pinned commit (`layout.server_argv`)."""
    argv = layout.server_argv(cfg)
    if revision is None:
        return argv
    return revision.apply(lambda sha: [*argv, "--revision", sha])


def rank_argvs(cfg: StackConfig, revision: pulumi.Output[str] | None) -> dict[str, Any] | None:
    """Under executor mp, each headless rank's final argument list by node (`layout.rank_argvs`)."""
    argvs = layout.rank_argvs(cfg)
    if argvs is None or revision is None:
        return argvs
    return {
        name: revision.apply(lambda sha, argv=argv: [*argv, "--revision", sha])
        for name, argv in argvs.items()
    }
