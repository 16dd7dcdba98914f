"""Prove that the image's vLLM accepts the server's exact command line, before any GPU is touched.

    python3 prove_args.py [--checkpoint SNAPSHOT_DIR] [--rank NODE ARGV_JSON]… -- vllm serve MODEL --flag …

Runs inside a throwaway container of the deployment image (the model-support check sends it on
stdin through node_programs/proof_bootstrap.py), offline. It parses the argument list with the
same code `vllm serve` runs first: vLLM's own `FlexibleArgumentParser` with the `serve`
subcommand's parser (`ServeSubcommand.subparser_init`, i.e. `make_arg_parser`), the subcommand's
`validate` (`validate_parsed_serve_args`), then `AsyncEngineArgs.from_cli_args`. With a checkpoint
and `--speculative-config`, it builds vLLM's `SpeculativeConfig` for this checkpoint's config
(as `create_engine_config` does) and, for the `mtp` method, requires `mtp.*` tensors in the
checkpoint's safetensors index.

Over several nodes (`--nnodes` > 1, executor mp) the `parallel` stage runs vLLM's
`EngineArgs.create_engine_config(headless=…)` as `vllm serve` does, up to the `ParallelConfig` it
builds: vLLM's own checks of the rank's layout (the world size divisible by `--nnodes`, `--node-rank`
below it, the backend), reported as `parallel`. The rest of that engine config needs the node's GPU
platform, so the stage stops once the ParallelConfig exists. Each rank's command line is proved on
its own: the head's (after `--`) and every headless rank's (`--rank NODE ARGV_JSON`, its argv as a
JSON list), one after the other in this one process, so vLLM is imported once for all of them.

The `loader` stage then checks that the image has the Python package its `--load-format` loads with:
vLLM imports `fastsafetensors`, `instanttensor`, `runai_model_streamer`, `tensorizer` or `gguf` only
once it loads the weights (a placeholder module until then), so without the package every stage
above passes and the server fails minutes into its start.

Stages, in order: environment (vLLM imports), parse, validate, engine_args, parallel, loader,
speculative. The last stdout line is one JSON report: verdict, failed_stage, flag (the flag at fault,
when known), error (vLLM's own message), vllm, parallel (the layout vLLM built, over several nodes),
loader (the package the load format needs, when it needs one); with `--rank`, `ranks` (NODE -> that
rank's own report, the same fields) beside the head's.
Exit 0 when every stage passes for every command line, 1 when one fails, 2 on a usage error.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import traceback

STAGES = ("environment", "parse", "validate", "engine_args", "parallel", "loader", "speculative")
# The module each load format's loader imports when it loads (vLLM's model_loader/weight_utils.py and
# tensorizer.py; tests/release/test_serve_args.py reads each release's sources for these imports), and
# the distribution that provides it.
LOADER_PACKAGES = {
    "fastsafetensors": ("fastsafetensors", "fastsafetensors"),
    "instanttensor": ("instanttensor", "instanttensor"),
    "runai_streamer": ("runai_model_streamer", "runai-model-streamer"),
    "runai_streamer_sharded": ("runai_model_streamer", "runai-model-streamer"),
    "tensorizer": ("tensorizer", "tensorizer"),
    "gguf": ("gguf", "gguf"),
}
INDEX = "model.safetensors.index.json"
# What argparse puts before the message: `vllm serve: error: …`.
ARGPARSE_ERROR = re.compile(r"error: (.*)$", re.DOTALL)
FLAG_IN_MESSAGE = re.compile(r"argument (--?[A-Za-z0-9][A-Za-z0-9_-]*)|(?<![\w-])(--?[A-Za-z][A-Za-z0-9_-]*)")


class StageFailed(Exception):
    """One stage said no: which stage, the flag at fault (when known) and vLLM's message."""

    def __init__(self, stage: str, error: str, flag: str | None = None):
        super().__init__(error)
        self.stage, self.error, self.flag = stage, error, flag


def flag_of(message: str) -> str | None:
    """The flag an argparse message names (`argument --x: …`, `unrecognized arguments: --x …`)."""
    match = FLAG_IN_MESSAGE.search(message)
    return (match.group(1) or match.group(2)) if match else None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def parse_serve(argv: list[str]):
    """`vllm serve …` through vLLM's own parser; (namespace, serve subcommand)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    words = argv[1:] if argv and os.path.basename(argv[0]) == "vllm" else argv
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(words)
    except SystemExit as exc:
        said = stderr.getvalue().strip()
        match = ARGPARSE_ERROR.search(said)
        message = (match.group(1) if match else said).strip() or f"argparse exited {exc.code}"
        raise StageFailed("parse", " ".join(message.split()), flag_of(message)) from None
    if args.subparser != "serve":
        raise StageFailed("parse", f"not a `vllm serve` command line: {words[:2]}")
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag  # what ServeSubcommand.cmd does before it builds the engine
    return args, command


def validate(args, command) -> None:
    try:
        command.validate(args)
    except Exception as exc:  # vLLM raises TypeError/ValueError with its own message
        raise StageFailed("validate", _one_line(exc), flag_of(str(exc))) from None


def engine_args_of(args):
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        return AsyncEngineArgs.from_cli_args(args)
    except Exception as exc:
        raise StageFailed("engine_args", _one_line(exc)) from None


class _Built(Exception):
    """create_engine_config built its ParallelConfig: the `parallel` stage has what it proves."""


class _CaptureParallel:
    """Stands for vLLM's ParallelConfig in arg_utils while the stage runs: builds the real one (its
    validation runs), keeps it, then stops create_engine_config."""

    def __init__(self, real: type):
        self.real, self.made = real, None

    def __getattr__(self, name: str):
        return getattr(self.real, name)  # class defaults create_engine_config reads

    def __call__(self, **kwargs):
        self.made = self.real(**kwargs)
        raise _Built


def prove_parallel(args, engine_args) -> dict | None:
    """Over several nodes: the rank's layout as vLLM builds it (None on one node), or StageFailed with
    vLLM's own message."""
    if int(getattr(args, "nnodes", 1) or 1) <= 1:
        return None
    import vllm.engine.arg_utils as arg_utils

    capture = _CaptureParallel(arg_utils.ParallelConfig)
    arg_utils.ParallelConfig = capture
    try:
        engine_args.create_engine_config(headless=bool(getattr(args, "headless", False)))
    except _Built:
        made = capture.made
        return {
            "world_size": made.world_size,
            "nnodes": made.nnodes,
            "node_rank": made.node_rank,
            "master_addr": made.master_addr,
            "master_port": made.master_port,
            "backend": made.distributed_executor_backend,
            "headless": bool(getattr(args, "headless", False)),
        }
    except Exception as exc:  # vLLM's refusals: AssertionError / ValueError with its message
        raise StageFailed("parallel", _one_line(exc), flag_of(str(exc))) from None
    finally:
        arg_utils.ParallelConfig = capture.real
    raise StageFailed("parallel", "create_engine_config returned without building a ParallelConfig")


def prove_loader(engine_args) -> str | None:
    """The package `--load-format` loads with (None for a format that needs none), or StageFailed
    when this image's python cannot find it."""
    import importlib.util

    chosen = getattr(engine_args, "load_format", "auto")
    chosen = str(getattr(chosen, "value", chosen))
    if chosen not in LOADER_PACKAGES:
        return None
    module, distribution = LOADER_PACKAGES[chosen]
    if importlib.util.find_spec(module) is None:
        raise StageFailed(
            "loader",
            f"--load-format {chosen} loads the weights with the Python package `{module}`, which this "
            f"image does not have: vLLM would fail only once it loads them (install `{distribution}` "
            "in the image, or leave serve.load_format at auto)",
            "--load-format",
        )
    return module


def _cpu_platform() -> None:
    # Without a GPU vLLM picks an "unspecified" platform with no device; its own CLI switches to the
    # CPU one in that case (`vllm bench`). The platform is resolved lazily into `_current_platform`.
    import vllm.platforms

    if vllm.platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        vllm.platforms._current_platform = CpuPlatform()


def index_tensor_names(checkpoint: str) -> list[str] | None:
    path = os.path.join(checkpoint, INDEX)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return list(json.load(handle).get("weight_map") or {})


def prove_speculative(engine_args, checkpoint: str) -> dict:
    """vLLM's SpeculativeConfig for this checkpoint, as create_engine_config builds it."""
    from vllm.config import ParallelConfig

    method = dict(engine_args.speculative_config).get("method")
    # The checkpoint on disk instead of the Hub id (the container is offline and has no HF cache).
    engine_args.model = checkpoint
    engine_args.tokenizer = checkpoint
    engine_args.revision = None
    engine_args.tokenizer_revision = None
    engine_args.skip_tokenizer_init = True
    engine_args.enforce_eager = True
    flag = "--speculative-config"
    try:
        model_config = engine_args.create_model_config()
        parallel = ParallelConfig(
            tensor_parallel_size=engine_args.tensor_parallel_size,
            pipeline_parallel_size=engine_args.pipeline_parallel_size,
        )
        speculative = engine_args.create_speculative_config(model_config, parallel)
    except Exception as exc:
        raise StageFailed("speculative", _one_line(exc), flag) from None
    resolved = getattr(speculative, "method", method)
    if resolved == "mtp" or str(method).endswith("mtp"):
        names = index_tensor_names(checkpoint)
        if names is not None and not any(name.startswith("mtp.") for name in names):
            raise StageFailed(
                "speculative",
                f"method {method!r} drafts with the checkpoint's MTP layers, but its {INDEX} holds "
                "no mtp.* tensors (a quantization that dropped them?)",
                flag,
            )
    return {
        "method": resolved,
        "num_speculative_tokens": getattr(speculative, "num_speculative_tokens", None),
        "draft_model_type": getattr(getattr(speculative, "draft_model_config", None), "hf_config", None)
        and speculative.draft_model_config.hf_config.model_type,
    }


def model_of(argv: list[str]) -> str | None:
    """The model positional of `vllm serve MODEL …` (None when the command line gives none)."""
    words = argv[1:] if argv and os.path.basename(argv[0]) == "vllm" else argv
    if len(words) >= 2 and words[0] == "serve" and not words[1].startswith("-"):
        return words[1]
    return None


def serve_from_cache(argv: list[str], checkpoint: str | None) -> str | None:
    """Present the mounted checkpoint as the Hugging Face cache the server reads.

    The server runs offline (`HF_HUB_OFFLINE=1`): vLLM resolves `MODEL --revision COMMIT` to that
    snapshot in the cache. The check mounts the repo folder (`models--ORG--NAME`) under another
    name, so a private cache links the model's entry to it; HF_HUB_CACHE must be set before vLLM
    (and the Hub client) is imported. Returns the cache, or None for a model that is a path.
    """
    model = model_of(argv)
    if not checkpoint or not model or model.startswith("/") or "/" not in model:
        return None
    snapshot = os.path.abspath(checkpoint)
    if os.path.basename(os.path.dirname(snapshot)) != "snapshots":
        return None
    cache = tempfile.mkdtemp(prefix="qwen35-args-hub-")
    atexit.register(shutil.rmtree, cache, True)
    os.symlink(
        os.path.dirname(os.path.dirname(snapshot)), os.path.join(cache, "models--" + model.replace("/", "--"))
    )
    os.environ["HF_HUB_CACHE"] = cache
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return cache


def prove(argv: list[str], checkpoint: str | None, model_here: bool = True) -> dict:
    """Every stage on `argv`. `model_here`: the model's files are in this container (the checkpoint
    mounted, or the model a path that exists): the `parallel` stage reads its config."""
    report: dict = {
        "verdict": "fail", "failed_stage": None, "flag": None, "error": "", "vllm": None,
        "parallel": None, "loader": None,
    }  # fmt: skip
    stage = "environment"
    try:
        try:
            import vllm
        except Exception as exc:
            raise StageFailed("environment", _one_line(exc)) from None
        report["vllm"] = getattr(vllm, "__version__", None)
        # Building the parser computes DeviceConfig's default, which needs a platform: the container
        # has no GPU, so make the CPU one current first. The flags accepted do not depend on it.
        _cpu_platform()
        stage = "parse"
        args, command = parse_serve(argv)
        stage = "validate"
        validate(args, command)
        stage = "engine_args"
        engine_args = engine_args_of(args)
        stage = "parallel"
        if model_here:
            report["parallel"] = prove_parallel(args, engine_args)
        elif int(getattr(args, "nnodes", 1) or 1) > 1:
            report["parallel"] = "not proved: the model's files are not mounted here"
        stage = "loader"
        report["loader"] = prove_loader(engine_args)
        report["speculative"] = None
        stage = "speculative"
        if engine_args.speculative_config:
            if checkpoint:
                report["speculative"] = prove_speculative(engine_args, checkpoint)
            else:
                report["speculative"] = "not proved: no checkpoint mounted"
        report.update(verdict="pass", stages=list(STAGES))
    except StageFailed as failed:
        report.update(failed_stage=failed.stage, error=failed.error, flag=failed.flag)
    except Exception as exc:  # a crash of the proof itself is reported at the stage it was in
        report.update(failed_stage=stage, error=_one_line(exc), where=traceback.format_exc(limit=-3))
    return report


USAGE = "usage: prove_args.py [--checkpoint DIR] [--rank NODE ARGV_JSON]… -- vllm serve MODEL [flags…]"


def options_of(options: list[str]) -> tuple[str | None, dict[str, list[str]]]:
    """(--checkpoint, {NODE: argv} of each --rank); ValueError naming what is wrong."""
    checkpoint, ranks, rest = None, {}, list(options)
    while rest:
        if rest[0] == "--checkpoint" and len(rest) >= 2:
            checkpoint, rest = rest[1], rest[2:]
        elif rest[0] == "--rank" and len(rest) >= 3:
            argv = json.loads(rest[2])
            if not (isinstance(argv, list) and all(isinstance(word, str) for word in argv)):
                raise ValueError(f"--rank {rest[1]}: its argv is not a JSON list of strings")
            ranks[rest[1]], rest = argv, rest[3:]
        else:
            raise ValueError(f"unknown options {rest}")
    return checkpoint, ranks


def prove_line(serve: list[str], checkpoint: str | None) -> dict:
    """Every stage on one command line, the model resolved as that line names it."""
    model_here = True
    if serve_from_cache(serve, checkpoint) is None:
        model = model_of(serve) or ""
        model_here = os.path.exists(model)
        if not model_here:
            # Nothing here to resolve the model against (a path on the nodes, not mounted; no
            # checkpoint): keep vLLM's offline mode from looking the model up in an empty cache. The
            # container has no network, so nothing is fetched either way.
            os.environ["HF_HUB_OFFLINE"] = "0"
    return prove(serve, checkpoint, model_here)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(USAGE, file=sys.stderr)
        return 2
    split = argv.index("--")
    try:
        checkpoint, ranks = options_of(argv[:split])
    except ValueError as exc:
        print(f"prove_args.py: {exc}\n{USAGE}", file=sys.stderr)
        return 2
    report = prove_line(argv[split + 1 :], checkpoint)
    if ranks:
        report["ranks"] = {node: prove_line(rank, checkpoint) for node, rank in ranks.items()}
    sys.stdout.flush()
    print(json.dumps(report, default=str))
    verdicts = [report["verdict"], *(r["verdict"] for r in (report.get("ranks") or {}).values())]
    return 0 if all(verdict == "pass" for verdict in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
