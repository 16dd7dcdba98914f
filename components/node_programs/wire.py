"""What the orchestrator and the node programs must agree on, declared once (a library, standard library
only: `program_argv` ships it with every program that imports it; the orchestrator imports it too).

The transfer's conversation, whose constants come first below: `components/transfer/__init__.py`.

Also here: the facts both sides read from Docker (the `--format` lines asked for, its image store,
image references as containerd records them) and the digest of a checkpoint's file list (the
Checkpoint resource and `status` compare it).
"""

from __future__ import annotations

# No module-level imports: `tcp_dial` carries this library into every ssh connection it dials, and
# hashlib, json and re would add ~5 ms to each; the functions import what they use (cached after once).

# ---- the transfer's conversation ---------------------------------------------------------------------

PROGRESS_MARKER = "qwen35-progress"  # stderr: `qwen35-progress <bytes done> [<bytes total>]`
REPORT_MARKER = "qwen35-report"  # stderr: a stage's own one-line JSON report
# ssh exits 255 when the connection itself failed; any other status is the remote command's.
SSH_TRANSPORT_FAILURE = 255
NUDGE = "nudge"  # the first line of the source's throwaway first channel to the sink's end
SERVED = b"+"  # the sink's answer to the token: the consumer runs, the stream follows
REFUSED = b"-"  # the sink's answer to a wrong token or a connection it will not serve
TAIL_LINES = 12  # stderr lines of a stage (or of the consumer) kept in a report

# ---- a node's folders, a probe's names -----------------------------------------------------------------

# Operations in flight each keep `<operation>.json` here (bytes, stage, ETA); `status` lists the folder.
PROGRESS_DIR = "~/.qwen35/progress"
TAG_RECORDS = "~/.qwen35/tags"  # image_tag: which NodeImages hold each tag, one JSON file per tag
STACK_RECORDS = "~/.qwen35/stacks"  # stack_claim: each stack's claim on a node, one JSON file per stack
# The readiness probe reads the server's API key from this variable (set by its stdin prelude, never
# argv); `status` reads the operator's from the same name.
PROBE_API_KEY_ENV = "QWEN35_API_KEY"
# The serve bench sizes its prefill prompt to within this share of bench.prompt_tokens (by the
# server's tokenizer); the config check that the request fits serve.max_model_len counts it too.
BENCH_PROMPT_SLACK = 0.05


def bench_prompt_slack(tokens: int) -> int:
    """How many tokens over `tokens` the bench's sized prompt may come out (5 %, at least 2)."""
    return max(int(tokens * BENCH_PROMPT_SLACK), 2)


PROBE_PROGRESS_PREFIX = "waiting "  # the probe's stderr lines the gate relays to the operator as they come


def http_failure(exc: OSError, url: str) -> tuple[str, bool]:
    """Why a request to the server failed, said for people, and whether the server refused the API
    key (401, 403): the bench's and the answer check's one reading of urllib's errors."""
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        if exc.code in (401, 403):
            return f"the server answered {exc.code}: the API key does not match the server's", True
        return f"the server answered {exc.code}: {exc.read()[:300].decode(errors='replace')}", False
    return f"{url}: {getattr(exc, 'reason', exc)}", False


# ---- Docker facts ------------------------------------------------------------------------------------

# The lines `docker … --format` prints for these formats are the lines `engine_api` builds from the API's
# answers; a node program uses the API, or a classic store's files, only when asked for exactly these.
INSPECT_FORMAT = "{{json .Id}}\t{{json .RootFS.Layers}}\t{{.Size}}"  # `docker image inspect`
INFO_FORMAT = "{{json .DriverStatus}}\t{{.DockerRootDir}}\t{{.ServerVersion}}\t{{.Driver}}"  # `docker info`
CONTAINERD_SNAPSHOTTER = "io.containerd.snapshotter"  # `docker info`'s driver-type on a containerd store
DEFAULT_TAG = "latest"
_HUB = "docker.io"
_DOMAIN_PART = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# A registry: a DNS name (letters may be upper case, as Docker allows) or IPv4 address, optional port.
_REGISTRY = rf"^{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]{{1,5}})?$"


def chain_ids(diff_ids: list[str] | tuple[str, ...]) -> list[str]:
    """Chain IDs of a layer list (diff IDs, bottom first): what a classic store keys layers by (each
    names its layer with all below)."""
    import hashlib

    chains: list[str] = []
    for diff_id in diff_ids:
        if chains:
            diff_id = "sha256:" + hashlib.sha256(f"{chains[-1]} {diff_id}".encode()).hexdigest()
        chains.append(diff_id)
    return chains


def image_store(driver_status: list | str | None) -> str:
    """'containerd' or 'classic': the image store `docker info`'s DriverStatus (its pairs, or their
    JSON text) names."""
    import json

    if isinstance(driver_status, str):
        try:
            driver_status = json.loads(driver_status)
        except ValueError:
            driver_status = None
    pairs = driver_status if isinstance(driver_status, list) else []
    containerd = any(
        isinstance(pair, list)
        and len(pair) == 2
        and pair[0] == "driver-type"
        and str(pair[1]).startswith(CONTAINERD_SNAPSHOTTER)
        for pair in pairs
    )
    return "containerd" if containerd else "classic"


def is_registry(component: str) -> bool:
    """Docker's rule: a reference's first component names a registry when it has a '.' or ':' or is
    localhost (and is a host[:port])."""
    import re

    return ("." in component or ":" in component or component == "localhost") and bool(
        re.match(_REGISTRY, component)
    )


def split_tag(reference: str, default: str | None = DEFAULT_TAG) -> tuple[str, str | None]:
    """`host:5000/x:1` -> (`host:5000/x`, `1`): a ':' after the last '/' starts the tag, one before it
    is a registry port; (reference, default) when there is no tag. No digest expected."""
    colon = reference.rfind(":")
    if colon > reference.rfind("/"):
        return reference[:colon], reference[colon + 1 :]
    return reference, default


def full_reference(reference: str) -> str:
    """`x:1` -> `docker.io/library/x:1` (how containerd annotates names in index.json)."""
    first, slash, _ = reference.partition("/")
    if slash and is_registry(first):
        return reference
    return f"{_HUB}/{reference}" if slash else f"{_HUB}/library/{reference}"


# ---- checkpoints -------------------------------------------------------------------------------------


def manifest_digest(pairs) -> str:
    """sha256 over the sorted (path, blob hash) pairs of a checkpoint, one `path<TAB>blob<LF>` each."""
    import hashlib

    digest = hashlib.sha256()
    for path, blob in sorted(pairs):
        digest.update(f"{path}\t{blob}\n".encode())
    return digest.hexdigest()
