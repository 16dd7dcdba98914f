"""Runs INSIDE the model-support container (stdlib only): unpacks the proof program and runs it.

The provider sends this file on stdin to `python3 -` in a short-lived container of the deployment's
image, after lines that set `PAYLOAD` (base64 of a gzip tar holding `prove_model.py` and its
`proof_configs/`, or `prove_cluster.py`), `DEADLINE_S` and optionally `PROGRAM_NAME` (the program in
the payload to run; `prove_model.py` when unset). Arguments after `-` go to the proof program unchanged; its
stdout, stderr and exit status are the container's. Only python3 is needed in the image.
"""

# No `from __future__` import: the provider puts PAYLOAD and DEADLINE_S above this file.
import base64
import io
import os
import runpy
import sys
import tarfile
import tempfile
import threading
from enum import IntEnum

PROGRAM = "prove_model.py"


class Exit(IntEnum):
    # The container outlives a cut SSH session (`docker run --rm` keeps running): stop it ourselves.
    DEADLINE = 124


def _deadline(seconds: float) -> None:
    timer = threading.Timer(seconds, lambda: os._exit(Exit.DEADLINE))
    timer.daemon = True
    timer.start()


def _unpack(payload: str) -> str:
    root = tempfile.mkdtemp(prefix="qwen35-proof-")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(payload)), mode="r:gz") as tar:
        for member in tar.getmembers():
            # Our own archive, but keep it inside `root` whatever it holds.
            outside = member.name.startswith("/") or ".." in member.name.split("/")
            if outside or not (member.isfile() or member.isdir()):
                raise SystemExit(f"proof bootstrap: refusing archive member {member.name!r}")
        # Python ≥ 3.12 warns on stderr without a filter; older ones have none.
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(root, **extra)
    return root


def main() -> None:
    payload = globals().get("PAYLOAD")
    if not payload:
        print("proof bootstrap: no PAYLOAD (run by the model-support check only)", file=sys.stderr)
        raise SystemExit(2)
    _deadline(float(globals().get("DEADLINE_S", 600)))
    root = _unpack(payload)
    # The argument proof (components/model_support/serve_args.py) names its program; the model proof does not.
    program = os.path.join(root, globals().get("PROGRAM_NAME") or PROGRAM)
    sys.argv = [program, *sys.argv[1:]]
    sys.path.insert(0, root)
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
