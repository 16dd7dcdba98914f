"""The destination's end of a transfer, started before the source knows what to send (runs ON THE
DESTINATION; standard library only).

    transfer_sink      stdin: `<length>\\n<JSON {"argv": [...]}>` then the stream; becomes that argv

The source opens this session while both nodes are still being inspected, so the destination's
SSH session (and its login shell's start-up) is paid for in parallel, not on the copy's path. The
header names the consumer; this program then replaces itself with it (exec), the stream's first
byte still unread on stdin. End of input before a header (nothing to send): exit 0.
"""

from __future__ import annotations

import json
import os
import sys
from enum import IntEnum


class Exit(IntEnum):
    NOTHING_TO_DO = 0
    BAD_HEADER = 98
    CANNOT_START = 99


def read_exact(count: int) -> bytes:
    data = b""
    while len(data) < count:
        more = os.read(0, count - len(data))
        if not more:
            break
        data += more
    return data


def main() -> int:
    digits = b""
    while not digits.endswith(b"\n"):
        byte = os.read(0, 1)  # unbuffered: what follows the header stays on stdin for the consumer
        if not byte:
            return Exit.NOTHING_TO_DO if not digits else Exit.BAD_HEADER
        digits += byte
        if len(digits) > 12:
            return Exit.BAD_HEADER
    try:
        header = json.loads(read_exact(int(digits)))
        argv = [str(arg) for arg in header["argv"]]
    except (ValueError, KeyError, TypeError):
        sys.stderr.write("transfer_sink: the stream does not start with a valid header\n")
        return Exit.BAD_HEADER
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"transfer_sink: cannot start {argv[0]}: {exc}\n")
    return Exit.CANNOT_START


if __name__ == "__main__":
    sys.exit(main())
