"""Lab helpers for NodeImage tests: props, small images built on a node, what a node holds.

Shared by tests/lab/test_node_image*.py (and any lab test that places an image with NodeImage).
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

import lab
from components.node_image import NodeImageProvider
from tests.support.lab_nodes import node_dict, tags_on

PROVIDER = NodeImageProvider()


def props(image: str, source: lab.LabNode, destination: lab.LabNode, tuning=None, **dst_overrides) -> dict:
    return {
        "image": image,
        "source": node_dict(source),
        "destination": node_dict(destination, **dst_overrides),
        "tuning": tuning or {},
        "trigger": "",
    }


def build(node: lab.LabNode, tag: str, base: str, payload: bytes) -> str:
    """`FROM base` + one layer holding `payload`, built on the node; its image ID."""
    buffer = io.BytesIO()
    dockerfile = f"FROM {base}\nCOPY blob /blob-{len(payload)}\n".encode()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile), ("blob", payload)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    lab.docker(node, "build", "--network", "host", "-q", "-t", tag, "-", input=buffer.getvalue(), timeout=300)
    return image_id(node, tag)


def image_id(node: lab.LabNode, ref: str) -> str | None:
    found = lab.docker(node, "image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return found.out if found.returncode == 0 else None


def remove(node: lab.LabNode, *refs: str) -> None:
    for ref in refs:
        lab.docker(node, "image", "rm", "-f", ref, check=False)


# Removes the tag record image_tag keeps on a node (~/.qwen35/tags/<quoted ref>.json).
FORGET_RECORD = (
    "import os,sys,urllib.parse;"
    "p=os.path.expanduser('~/.qwen35/tags/'+urllib.parse.quote(sys.argv[1],safe='')+'.json');"
    "os.path.exists(p) and os.unlink(p)"
)


def remove_with_record(node: lab.LabNode, ref: str) -> None:
    """The tag and NodeImage's record of who holds it: the node as if no NodeImage had been there."""
    remove(node, ref)
    lab.on_node(node, ["python3", "-c", FORGET_RECORD, ref])


def runs(node: lab.LabNode, ref: str) -> str:
    return lab.docker(node, "run", "--rm", "--network", "host", ref, "cat", "/etc/group").out


def no_temporary_tags(node: lab.LabNode) -> bool:
    return not [t for t in tags_on(node) if "qwen35-tmp-" in t]


class PeerFolders:
    """The private folders of the sources' SSH masters to destinations that NodeImage operations in
    this process make (lab nodes share this machine's /tmp): `take()` returns those made since the last
    call."""

    def __init__(self, monkeypatch):
        from components.node_image import execute

        self.made: list[str] = []
        real = execute.Peers.new

        def new(peers, forwarded=False):
            peer = real(peers, forwarded)
            self.made.append(peer.folder)
            return peer

        monkeypatch.setattr(execute.Peers, "new", new)

    def take(self) -> list[str]:
        made, self.made = self.made, []
        return made


def peer_folders_gone(folders: list[str], wait_s: float = 3.0) -> bool:
    """None of these masters' folders is left: a copy ends its master in the background (wait_s), a skip
    before create returns (wait_s=0)."""
    deadline = time.monotonic() + wait_s
    while any(Path(f).exists() for f in folders) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(Path(f).exists() for f in folders)
