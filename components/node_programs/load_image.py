"""A NodeImage copy's consumer (runs ON THE DESTINATION; standard library only).

    load_image SPEC    stdin: a docker-load archive. SPEC (JSON): tmp_ref, ref, compare ("id" or
                       "layers"), want (the wanted image ID or layer list), inspect_format.

`docker load` lands the image on the temporary tag `tmp_ref`; only when the loaded image is the wanted
one (its ID within one image-store kind, its layer list across kinds) is `ref` tagged, then `tmp_ref`
dropped. A mismatch removes `tmp_ref` again. Prints one JSON report on stdout: outcome, promoted, the
loaded image's inspect line, and the tail of a failed command's stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
from enum import IntEnum


class Exit(IntEnum):
    """Exit status, one per outcome (255 is ssh's own: the link failed)."""

    PROMOTED = 0
    LOAD_FAILED = 2
    INSPECT_FAILED = 3
    MISMATCH = 4
    TAG_FAILED = 5
    USAGE = 6


OUTCOMES = {
    Exit.PROMOTED: "promoted",
    Exit.LOAD_FAILED: "docker load failed on the destination",
    Exit.INSPECT_FAILED: "the loaded image could not be inspected on the destination",
    Exit.MISMATCH: "the loaded image does not match the source",
    Exit.TAG_FAILED: "docker tag / docker image rm of the temporary tag failed on the destination",
}


def docker(*args: str, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], stdin=stdin, capture_output=True)


def tail(data: bytes, lines: int = 6) -> str:
    return "\n".join(data.decode(errors="replace").strip().splitlines()[-lines:])


def load(spec: dict) -> tuple[Exit, dict]:
    report: dict = {"promoted": False, "loaded": "", "stderr": ""}
    loaded = docker("load", stdin=None)  # the archive: this program's stdin
    if loaded.returncode:
        report["stderr"] = tail(loaded.stderr or loaded.stdout)
        return Exit.LOAD_FAILED, report
    inspected = docker("image", "inspect", "--format", spec["inspect_format"], spec["tmp_ref"])
    if inspected.returncode:
        report["stderr"] = tail(inspected.stderr)
        return Exit.INSPECT_FAILED, report
    line = inspected.stdout.decode().strip()
    report["loaded"] = line
    fields = line.split("\t")
    found = json.loads(fields[0]) if spec["compare"] == "id" else (json.loads(fields[1]) or [])
    if found != spec["want"]:
        docker("image", "rm", spec["tmp_ref"])
        return Exit.MISMATCH, report
    tagged = docker("tag", spec["tmp_ref"], spec["ref"])
    if tagged.returncode:
        report["stderr"] = tail(tagged.stderr)
        return Exit.TAG_FAILED, report
    report["promoted"] = True
    dropped = docker("image", "rm", spec["tmp_ref"])
    if dropped.returncode:
        report["stderr"] = tail(dropped.stderr)
        return Exit.TAG_FAILED, report
    return Exit.PROMOTED, report


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: load_image SPEC\n")
        return Exit.USAGE
    status, report = load(json.loads(argv[0]))
    report["outcome"] = OUTCOMES[status]
    report["exit"] = int(status)
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
