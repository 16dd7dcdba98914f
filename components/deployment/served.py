"""What the cluster serves, as values: the server's final argument list, each headless rank's
(executor mp), and what the readiness gate records as deployed. No resource is declared here.
"""

from __future__ import annotations

from typing import Any

import pulumi

from components.config import Executor, ImageStrategy, StackConfig
from components.mp_executor import mp_serve_argv
from components.vllm_server import serve_argv


def deployed(cfg: StackConfig, ref: str, revision: pulumi.Output[str] | None) -> pulumi.Input[dict]:
    """What the gate records as served once it passes: the image reference and the checkpoint's
    commit, each with the config line that selects it again (the rollback hint of a later failure)."""
    if cfg.image.strategy is ImageStrategy.PREBUILT:
        image_line = f"image.prebuilt: {ref}"
    else:  # a build's tag is a hash of its inputs: going back is the image section that built it
        image_line = f"image (the {cfg.image.strategy.value} inputs that built {ref})"
    if revision is None:
        return {"image": ref, "revision": None, "lines": {"image": image_line}}
    return revision.apply(
        lambda sha: {
            "image": ref,
            "revision": sha,
            "lines": {"image": image_line, "revision": f"model.revision: {sha}"},
        }
    )


def server_argv(cfg: StackConfig, revision: pulumi.Output[str] | None) -> pulumi.Input[list[str]]:
    """The server's final argument list, as its container runs it (`--revision` the pinned commit):
    under executor mp the head's rank 0 (each headless rank's is `rank_argvs`)."""
    argv = mp_serve_argv(cfg, cfg.head) if cfg.cluster.executor is Executor.MP else serve_argv(cfg.serve)
    if revision is None:
        return argv
    return revision.apply(lambda sha: [*argv, "--revision", sha])


def rank_argvs(cfg: StackConfig, revision: pulumi.Output[str] | None) -> dict[str, Any] | None:
    """Under executor mp, each headless rank's final argument list by node (its node rank and
    `--headless` differ from the head's); None under Ray, where one server runs, and on one node."""
    if cfg.cluster.executor is not Executor.MP or not cfg.workers:
        return None
    argvs = {n.name: mp_serve_argv(cfg, n) for n in cfg.workers}
    if revision is None:
        return argvs
    return {
        name: revision.apply(lambda sha, argv=argv: [*argv, "--revision", sha])
        for name, argv in argvs.items()
    }
