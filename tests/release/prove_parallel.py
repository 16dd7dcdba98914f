"""Run with a release venv's python: does vLLM's own engine-config path accept a `vllm serve` command
line's multi-node layout (`--nnodes`, `--node-rank`, `--headless`, the executor backend)?

    python prove_parallel.py --checkpoint SNAPSHOT_DIR -- vllm serve MODEL --flag value …

The command line goes through patches/prove_args.py's stages (vLLM's parser, the subcommand's
validate, `AsyncEngineArgs.from_cli_args`), then `EngineArgs.create_engine_config(headless=…)` as
`vllm serve` calls it: its own nnodes checks (world size divisible by nnodes, node_rank < nnodes),
then vLLM's `ParallelConfig` with its validation. Building the rest of the engine config needs a GPU
platform, so the run stops once that ParallelConfig exists. The last stdout line is a JSON report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "patches"))

import prove_args  # noqa: E402 (patches/ is put on the path just above)


class Reached(Exception):
    """create_engine_config built the ParallelConfig: what this proof is about is done."""


class CaptureParallel:
    """Stands for vLLM's ParallelConfig in arg_utils: builds the real one, keeps it, then stops."""

    def __init__(self, real: type):
        self.real = real
        self.made = None

    def __getattr__(self, name: str):
        # create_engine_config reads class defaults (ParallelConfig.data_parallel_rpc_port).
        return getattr(self.real, name)

    def __call__(self, **kwargs):
        self.made = self.real(**kwargs)
        raise Reached


def prove(serve: list[str]) -> dict:
    # The CPU platform first: arg_utils binds `current_platform` when it is imported.
    prove_args._cpu_platform()
    import vllm.engine.arg_utils as arg_utils

    args, command = prove_args.parse_serve(serve)
    prove_args.validate(args, command)
    engine_args = prove_args.engine_args_of(args)
    capture = CaptureParallel(arg_utils.ParallelConfig)
    arg_utils.ParallelConfig = capture
    try:
        engine_args.create_engine_config(headless=bool(args.headless))
    except Reached:
        made = capture.made
        return {
            "verdict": "pass",
            "parallel": {
                "world_size": made.world_size,
                "nnodes": made.nnodes,
                "node_rank": made.node_rank,
                "master_addr": made.master_addr,
                "master_port": made.master_port,
                "backend": made.distributed_executor_backend,
                "headless": bool(args.headless),
            },
        }
    return {"verdict": "fail", "error": "create_engine_config never built a ParallelConfig"}


def main(argv: list[str]) -> int:
    split = argv.index("--")
    options, serve = argv[:split], argv[split + 1 :]
    checkpoint = options[1] if options[:1] == ["--checkpoint"] else None
    prove_args.serve_from_cache(serve, checkpoint)  # before vLLM (and the Hub client) is imported
    try:
        report = prove(serve)
    except prove_args.StageFailed as failed:
        report = {"verdict": "fail", "stage": failed.stage, "error": failed.error}
    except Exception as exc:  # vLLM's own refusals are AssertionError / ValueError with its message
        report = {"verdict": "fail", "stage": "engine_config", "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.flush()
    print(json.dumps(report, default=str))
    return 0 if report["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
