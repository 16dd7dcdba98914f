"""NodeImage against the real two-node lab (node-a -> node-b, Docker 20.10, real SSH).

Provider methods are called directly; images are busybox plus a few small random layers.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

import lab
from components.node_image import NodeImageError
from lab.nodes import bind_error
from tests.support.node_image_lab import (
    PROVIDER,
    PeerFolders,
    build,
    image_id,
    no_temporary_tags,
    peer_folders_gone,
    props,
    remove,
    runs,
)


@pytest.fixture(scope="module")
def pair(node_a, node_b):
    lab.busybox_image(node_a)
    return node_a, node_b


# "save": `docker save` through the filter; "auto": layers read from the source's layer store.
EXPORTS = pytest.mark.parametrize(("export", "layout"), [("save", "legacy"), ("auto", "export")])


@EXPORTS
def test_fresh_copy_then_repeat_sends_nothing(pair, export, layout, monkeypatch):
    src, dst = pair
    wanted = build(src, "ni-fresh:1", "lab-busybox:1", os.urandom(300_000))
    remove(dst, "ni-fresh:1", "lab-busybox:1")
    connections = PeerFolders(monkeypatch)
    first = PROVIDER.create(props("ni-fresh:1", src, dst, tuning={"source_export": export})).outs
    assert first["skipped"] is False and first["placed_tag"] is True
    assert first["image_id"] == wanted == image_id(dst, "ni-fresh:1")
    assert first["bytes_sent"] > 300_000 and first["layers_sent"] + first["layers_left_out"] == 2
    assert first["store"] == "classic" and first["layout"] == layout
    assert "root" in runs(dst, "ni-fresh:1")
    assert no_temporary_tags(dst)
    copied = connections.take()
    assert copied and peer_folders_gone(copied)  # the copy's master ends in the background
    again = PROVIDER.create(props("ni-fresh:1", src, dst)).outs
    assert again["skipped"] is True and again["bytes_sent"] == 0
    assert again["image_id"] == wanted
    # the connection made speculatively during the source's inspection was closed before create
    # returned, not left behind
    skipped = connections.take()
    assert skipped and peer_folders_gone(skipped, wait_s=0)


@EXPORTS
def test_changed_top_layer_sends_only_that_layer(pair, export, layout):
    src, dst = pair
    build(src, "ni-base:1", "lab-busybox:1", os.urandom(1_000_000))
    PROVIDER.create(props("ni-base:1", src, dst))
    top = os.urandom(200_000)
    wanted = build(src, "ni-top:1", "ni-base:1", top)
    remove(dst, "ni-top:1")
    outs = PROVIDER.create(props("ni-top:1", src, dst, tuning={"source_export": export})).outs
    assert outs["image_id"] == wanted and outs["layers_left_out"] == 2 and outs["layers_sent"] == 1
    assert outs["layout"] == layout
    assert len(top) <= outs["layer_bytes_sent"] <= len(top) + 4096
    assert outs["bytes_sent"] <= 1.2 * len(top)
    assert "root" in runs(dst, "ni-top:1")


def test_only_the_tag_missing_is_a_retag(pair):
    src, dst = pair
    wanted = build(src, "ni-retag:1", "lab-busybox:1", os.urandom(50_000))
    PROVIDER.create(props("ni-retag:1", src, dst))
    lab.docker(dst, "tag", "ni-retag:1", "ni-retag:keep")  # the image stays when its tag goes
    remove(dst, "ni-retag:1")
    outs = PROVIDER.create(props("ni-retag:1", src, dst)).outs
    assert outs["retagged"] is True and outs["bytes_sent"] == 0 and image_id(dst, "ni-retag:1") == wanted
    remove(dst, "ni-retag:keep")


def test_gone_on_destination_read_reports_it_and_create_copies_again(pair):
    src, dst = pair
    build(src, "ni-gone:1", "lab-busybox:1", os.urandom(100_000))
    outs = PROVIDER.create(props("ni-gone:1", src, dst)).outs
    assert PROVIDER.read("node-b/ni-gone:1", outs).id == "node-b/ni-gone:1"
    remove(dst, "ni-gone:1")
    gone = PROVIDER.read("node-b/ni-gone:1", outs)
    assert gone.id == "" and gone.outs == {}
    again = PROVIDER.create(props("ni-gone:1", src, dst)).outs
    assert again["skipped"] is False and image_id(dst, "ni-gone:1") == again["image_id"]


def test_drift_on_destination_is_read_and_diff_replaces(pair):
    src, dst = pair
    build(src, "ni-drift:1", "lab-busybox:1", os.urandom(80_000))
    outs = PROVIDER.create(props("ni-drift:1", src, dst)).outs
    lab.busybox_image(dst)
    other = build(dst, "ni-other:1", "lab-busybox:1", os.urandom(10_000))
    lab.docker(dst, "tag", "ni-other:1", "ni-drift:1")
    refreshed = PROVIDER.read("node-b/ni-drift:1", outs)
    assert refreshed.outs["image_id"] == other
    diff = PROVIDER.diff("node-b/ni-drift:1", refreshed.outs, props("ni-drift:1", src, dst))
    assert diff.changes and "image" in diff.replaces
    unchanged = PROVIDER.diff("node-b/ni-drift:1", outs, props("ni-drift:1", src, dst))
    assert not unchanged.changes and not unchanged.replaces
    # delete() leaves a tag that no longer points at the image it placed
    PROVIDER.delete("node-b/ni-drift:1", outs)
    assert image_id(dst, "ni-drift:1") == other
    remove(dst, "ni-drift:1", "ni-other:1")


def test_delete_removes_only_its_own_tag(pair):
    src, dst = pair
    build(src, "ni-del:1", "lab-busybox:1", os.urandom(20_000))
    lab.busybox_image(dst)
    remove(dst, "ni-del:1")
    outs = PROVIDER.create(props("ni-del:1", src, dst)).outs
    PROVIDER.delete("node-b/ni-del:1", outs)
    assert image_id(dst, "ni-del:1") is None
    assert image_id(dst, "lab-busybox:1") is not None  # what was there before stays
    same_node = PROVIDER.create(props("lab-busybox:1", src, src)).outs
    assert same_node["skipped"] is True and same_node["bytes_sent"] == 0
    PROVIDER.delete("node-a/lab-busybox:1", same_node)
    assert image_id(src, "lab-busybox:1") is not None


def stop_dockerd(name: str) -> None:
    """Stop a lab node's dockerd (SIGTERM, then wait until its socket stops answering)."""
    from lab.nodes import running_dockerd

    pid = running_dockerd(name)
    assert pid, f"{name}'s dockerd should be running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and running_dockerd(name):
        time.sleep(0.2)
    assert not running_dockerd(name), f"{name}'s dockerd did not stop"


def test_destination_daemon_stopped_names_the_node(pair):
    src, dst = pair
    build(src, "ni-stopped:1", "lab-busybox:1", os.urandom(10_000))
    stop_dockerd(dst.name)
    try:
        with pytest.raises(NodeImageError) as caught:
            PROVIDER.create(props("ni-stopped:1", src, dst))
        message = str(caught.value)
        assert "node-b" in message and "Docker" in message and "next:" in message
    finally:
        lab.up([dst.name])
    assert image_id(dst, "ni-stopped:1") is None


def test_ssh_refused_from_source_names_both_nodes(pair):
    src, dst = pair
    build(src, "ni-refused:1", "lab-busybox:1", os.urandom(10_000))
    remove(dst, "ni-refused:1")
    nobody = lab.spare_address(dst.port)  # nothing listens there: the connection is refused
    with pytest.raises(NodeImageError) as caught:
        PROVIDER.create(props("ni-refused:1", src, dst, fabric_host=nobody))
    message = str(caught.value)
    assert "cannot SSH" in message and "node-a" in message and "node-b" in message
    assert image_id(dst, "ni-refused:1") is None
    # A skip needs no connection between the nodes: the one tried during the inspection failing
    # is not an error when nothing has to be sent.
    PROVIDER.create(props("ni-refused:1", src, dst))
    again = PROVIDER.create(props("ni-refused:1", src, dst, fabric_host=nobody)).outs
    assert again["skipped"] is True and again["bytes_sent"] == 0
    remove(dst, "ni-refused:1")


def test_disk_preflight_refuses_before_sending(pair):
    src, dst = pair
    build(src, "ni-disk:1", "lab-busybox:1", os.urandom(10_000))
    remove(dst, "ni-disk:1")
    with pytest.raises(NodeImageError) as caught:
        PROVIDER.create(props("ni-disk:1", src, dst, tuning={"disk_reserve_bytes": 1 << 60}))
    assert "not enough disk" in str(caught.value) and "node-b" in str(caught.value)
    assert image_id(dst, "ni-disk:1") is None


class CutProxy:
    """A TCP relay to the destination's sshd that cuts (or freezes) the stream after `limit` bytes."""

    def __init__(self, listen: str, port: int, target: tuple[str, int], limit: int, freeze: bool = False):
        self.target, self.limit, self.freeze = target, limit, freeze
        self.server = socket.create_server((listen, port), reuse_port=False)
        self.sockets: list[socket.socket] = []
        self.sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket, counted: bool):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                if counted:
                    self.sent += len(data)
                    if self.sent > self.limit:
                        if self.freeze:
                            time.sleep(3600)
                        break
                b.sendall(data)
        except OSError:
            pass
        self.close_streams()

    def close_streams(self):
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass

    def close(self):
        # shutdown first: a close alone leaves the socket listening while _accept waits in accept()
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.close_streams()


def relay_known_hosts(dst: lab.LabNode, address: str, tmp_path: Path) -> str:
    """A known_hosts that pins the destination's own host key for the relay's address too."""
    lines = Path(dst.known_hosts).read_text().splitlines()
    mine = [line for line in lines if line.startswith(f"[{dst.host}]:{dst.port} ")]
    extra = [line.replace(f"[{dst.host}]:{dst.port}", f"[{address}]:{dst.port}", 1) for line in mine]
    path = tmp_path / "known_hosts"
    path.write_text("\n".join(lines + extra) + "\n")
    return str(path)


@pytest.mark.parametrize("freeze", [False, True], ids=["cut", "stall"])
def test_stream_broken_midway_leaves_nothing_tagged(pair, tmp_path, freeze):
    src, dst = pair
    address = lab.spare_address(dst.port)
    build(src, "ni-cut:1", "lab-busybox:1", os.urandom(8_000_000))
    remove(dst, "ni-cut:1")
    proxy = CutProxy(address, dst.port, (dst.host, dst.port), limit=2_000_000, freeze=freeze)
    tuning = {"peer_known_hosts": relay_known_hosts(dst, address, tmp_path), "stall_timeout_s": 5}
    try:
        with pytest.raises(NodeImageError) as caught:
            PROVIDER.create(props("ni-cut:1", src, dst, tuning=tuning, fabric_host=address))
    finally:
        proxy.close()
    message = str(caught.value)
    assert "node-a" in message and "node-b" in message and "nothing was tagged" in message
    if freeze:
        assert "stalled" in message
    time.sleep(1)  # a docker load that was cut off ends now
    assert image_id(dst, "ni-cut:1") is None and no_temporary_tags(dst)


def test_verification_failure_leaves_no_tag(pair, monkeypatch):
    import components.node_image as ni
    from components.node_image import execute

    src, dst = pair
    build(src, "ni-verify:1", "lab-busybox:1", os.urandom(30_000))
    remove(dst, "ni-verify:1")
    real = execute.load_argv

    def expect_another_image(tmp_ref, ref, wanted, same_store, python="python3", claim=""):
        return real(
            tmp_ref, ref, ni.ImageInfo("sha256:" + "0" * 64, wanted.layers[:1]), same_store, python, claim
        )

    monkeypatch.setattr(execute, "load_argv", expect_another_image)
    with pytest.raises(NodeImageError, match="does not match the source"):
        PROVIDER.create(props("ni-verify:1", src, dst))
    assert image_id(dst, "ni-verify:1") is None and no_temporary_tags(dst)


def test_gzip_compression_sends_fewer_bytes(pair):
    src, dst = pair
    wanted = build(src, "ni-gzip:1", "lab-busybox:1", bytes(2_000_000))  # zeros: very compressible
    remove(dst, "ni-gzip:1")
    outs = PROVIDER.create(props("ni-gzip:1", src, dst, tuning={"compression": "gzip"})).outs
    assert outs["image_id"] == wanted and outs["layer_bytes_sent"] >= 2_000_000
    assert outs["bytes_sent"] < outs["layer_bytes_sent"] / 10
    assert "root" in runs(dst, "ni-gzip:1")


def test_unreadable_layer_store_falls_back_to_docker_save(pair, monkeypatch):
    from components.node_image import execute

    src, dst = pair
    wanted = build(src, "ni-fallback:1", "lab-busybox:1", os.urandom(40_000))
    remove(dst, "ni-fallback:1")
    real = execute.filter_spec

    def unreadable_store(*args, export=None, **kwargs):
        return real(*args, export=export and {**export, "root": "/nonexistent"}, **kwargs)

    monkeypatch.setattr(execute, "filter_spec", unreadable_store)
    outs = PROVIDER.create(props("ni-fallback:1", src, dst)).outs
    assert outs["layout"] == "legacy" and outs["image_id"] == wanted == image_id(dst, "ni-fallback:1")
    assert no_temporary_tags(dst)


# ---- replacements: the engine creates the new resource, then deletes the old one --------------------


def replace(old_props: dict, old_outs: dict, new_props: dict, id_: str) -> dict:
    """What `pulumi up` does for a replacement: diff says replace, create the new, delete the old."""
    assert PROVIDER.diff(id_, old_outs, new_props).replaces, "expected a replacement"
    new_outs = PROVIDER.create(new_props).outs
    PROVIDER.delete(id_, old_outs)
    return new_outs


def test_replacement_for_a_new_trigger_keeps_the_image(pair):
    src, dst = pair
    wanted = build(src, "ni-own:1", "lab-busybox:1", os.urandom(30_000))
    remove(dst, "ni-own:1")
    first = props("ni-own:1", src, dst)
    old = PROVIDER.create(first).outs
    assert old["placed_tag"] is True
    new_props = {**first, "trigger": "rebuild-2"}
    new = replace(first, old, new_props, "node-b/ni-own:1")
    assert new["skipped"] is True and new["holds_tag"] is True
    assert image_id(dst, "ni-own:1") == wanted  # the old one's delete left it: the new one holds it
    refreshed = PROVIDER.read("node-b/ni-own:1", new)
    assert refreshed.id and refreshed.outs["image_id"] == wanted
    assert not PROVIDER.diff("node-b/ni-own:1", refreshed.outs, new_props).changes  # refresh: no drift
    PROVIDER.delete("node-b/ni-own:1", refreshed.outs)  # the survivor's delete removes it
    assert image_id(dst, "ni-own:1") is None


def image_exists(node: lab.LabNode, image: str) -> bool:
    return lab.docker(node, "image", "inspect", image, check=False).returncode == 0


@pytest.mark.parametrize("held_by", [None, "tag", "container"])
def test_a_build_under_the_same_tag_leaves_no_image_behind_on_the_node(pair, held_by):
    """A rebuild under the same tag (a moved base, a pinned image.tag) re-places the tag on node-b;
    the old copy's delete then removes the image it had placed, now untagged. Unless something else
    still names or uses it: another tag, or a container (a stopped one too)."""
    src, dst = pair
    ref = f"ni-same-{held_by or 'free'}:1"
    first_id = build(src, ref, "lab-busybox:1", os.urandom(25_000))
    remove(dst, ref)
    first = {**props(ref, src, dst), "trigger": first_id}
    old = PROVIDER.create(first).outs
    assert old["placed_tag"] is True and image_id(dst, ref) == first_id
    # The head's own NodeImage of the build: it placed nothing (the build did), it finds the image.
    at_head = {**props(ref, src, src), "trigger": first_id}
    old_head = PROVIDER.create(at_head).outs
    assert old_head["skipped"] is True and old_head["placed_tag"] is False
    holder = f"ni-same-holder-{os.getpid()}"
    if held_by == "tag":
        lab.docker(dst, "tag", first_id, f"{ref}-kept")
    elif held_by == "container":
        lab.docker(dst, "create", "--name", holder, first_id, "true")
    try:
        second_id = build(src, ref, "lab-busybox:1", os.urandom(25_000))  # the same tag, a new image
        assert second_id != first_id
        replace(first, old, {**first, "trigger": second_id}, f"node-b/{ref}")
        assert image_id(dst, ref) == second_id
        assert image_exists(dst, first_id) is (held_by is not None), held_by
        replace(at_head, old_head, {**at_head, "trigger": second_id}, f"node-a/{ref}")
        assert image_id(src, ref) == second_id and not image_exists(src, first_id)
    finally:
        lab.docker(dst, "rm", "-f", holder, check=False)
        remove(dst, ref, f"{ref}-kept", first_id)
        remove(src, ref, first_id)


@contextlib.contextmanager
def listening(addresses: list[str], port: int):
    """Another service on the machine, listening at `address:port` for each of `addresses`: ours,
    or one already there (then the address is taken, which is the condition, and it is used as is)."""
    with contextlib.ExitStack() as stack:
        for address in addresses:
            try:
                stack.enter_context(socket.create_server((address, port)))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        for address in addresses:
            assert bind_error(address, port) is not None, f"{address}:{port} should be taken"
        yield


def test_an_address_another_service_holds_is_taken_as_it_is():
    port = 2222
    address = lab.spare_address(port)
    with socket.create_server((address, port)), listening([address, address], port):
        assert bind_error(address, port) is not None


@pytest.mark.parametrize("taken", [False, True], ids=["free", "address-taken"])
def test_renamed_fabric_host_is_an_update_and_a_replacement_would_keep_the_image(pair, tmp_path, taken):
    src, dst = pair
    # The address this test once took for granted, and the first the lab would offer.
    with listening(["127.0.0.12", lab.spare_address(dst.port)] if taken else [], dst.port):
        renamed_fabric_host(src, dst, tmp_path)


def renamed_fabric_host(src: lab.LabNode, dst: lab.LabNode, tmp_path: Path) -> None:
    wanted = build(src, "ni-fab:1", "lab-busybox:1", os.urandom(30_000))
    remove(dst, "ni-fab:1")
    first = props("ni-fab:1", src, dst)
    old = PROVIDER.create(first).outs
    # Another name for the same node: a relay on another address that forwards to its sshd.
    alias = lab.spare_address(dst.port)
    relay = CutProxy(alias, dst.port, (dst.host, dst.port), limit=1 << 40)
    try:
        tuning = {"peer_known_hosts": relay_known_hosts(dst, alias, tmp_path)}
        renamed = props("ni-fab:1", src, dst, tuning=tuning, fabric_host=alias)
        diff = PROVIDER.diff("node-b/ni-fab:1", old, renamed)
        assert diff.changes and not diff.replaces  # how the node is reached: an in-place update
        updated = PROVIDER.update("node-b/ni-fab:1", old, renamed).outs
        assert updated["destination"]["fabric_host"] == alias and updated["claim"] == old["claim"]
        # Had the engine replaced it (create new, delete old), the image would stay all the same.
        new = PROVIDER.create(renamed).outs
        PROVIDER.delete("node-b/ni-fab:1", updated)
    finally:
        relay.close()
    assert image_id(dst, "ni-fab:1") == wanted and new["holds_tag"] is True
    refreshed = PROVIDER.read("node-b/ni-fab:1", new)
    assert refreshed.outs["image_id"] == wanted
    assert not PROVIDER.diff("node-b/ni-fab:1", refreshed.outs, renamed).changes
    PROVIDER.delete("node-b/ni-fab:1", refreshed.outs)
    assert image_id(dst, "ni-fab:1") is None


def test_a_resource_that_never_placed_the_tag_never_removes_it(pair):
    src, dst = pair
    wanted = build(src, "ni-byhand:1", "lab-busybox:1", os.urandom(20_000))
    remove(dst, "ni-byhand:1")
    lab.busybox_image(dst)
    # Put there by hand (docker save | docker load), not by a NodeImage.
    lab.on_node(dst, ["docker", "load"], input=lab.on_node(src, ["docker", "save", "ni-byhand:1"]).stdout)
    outs = PROVIDER.create(props("ni-byhand:1", src, dst)).outs
    assert outs["skipped"] is True and outs["holds_tag"] is False and outs["placed_tag"] is False
    PROVIDER.delete("node-b/ni-byhand:1", outs)
    assert image_id(dst, "ni-byhand:1") == wanted
    remove(dst, "ni-byhand:1")


def test_a_destination_tag_on_another_image_is_copied_over_never_claimed(pair):
    src, dst = pair
    wanted = build(src, "ni-else:1", "lab-busybox:1", os.urandom(20_000))
    lab.busybox_image(dst)
    other = build(dst, "ni-else:1", "lab-busybox:1", os.urandom(5_000))  # same tag, another image
    outs = PROVIDER.create(props("ni-else:1", src, dst)).outs
    assert outs["skipped"] is False and outs["image_id"] == wanted == image_id(dst, "ni-else:1") != other
    PROVIDER.delete("node-b/ni-else:1", outs)
    assert image_id(dst, "ni-else:1") is None
