"""Stacks under the real engine: secrets that never leave the containers,
a rotated API key that replaces only what carries it, and two environments of one project up at the
same time. The evidence is the engine's own events, state and display, and the nodes themselves."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import secrets as pysecrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import lab
from components.node_programs.health_wire import API_KEY_ENV as HEALTH_API_KEY_ENV
from components.node_programs.health_wire import SECRET_ENV as HEALTH_SECRET_ENV
from components.node_programs.health_wire import SECRET_FILE as HEALTH_SECRET_FILE
from engine import ROOT, CliResult
from lab.layout import lab_dir
from lab.ray_image import ray_image
from lab.sessions import lab_session
from tests.engine.conftest import (
    CONTAINER,
    GATE,
    PROVIDER,
    UNCHANGED,
    Stack,
    clear_caches,
    finished,
    new_stack,
    secret_stack,
    urn_name,
)

pytestmark = pytest.mark.engine

NAMESPACE = "qwen35-spark"


def steps_by_resource(events: list[dict]) -> dict[str, tuple[str, set[str]]]:
    """Resource name -> (type, every op the engine reported for it), from `--json` / event-log events."""
    seen: dict[str, tuple[str, set[str]]] = {}
    for event in events:
        for kind in ("resourcePreEvent", "resOutputsEvent"):
            meta = (event.get(kind) or {}).get("metadata")
            if meta:
                typ, ops = seen.setdefault(urn_name(meta["urn"]), (meta["type"], set()))
                ops.add(meta["op"])
    return seen


def changed(events: list[dict]) -> dict[str, set[str]]:
    return {name: ops for name, (_, ops) in steps_by_resource(events).items() if set(ops) - set(UNCHANGED)}


def http_status(url: str, key: str | None) -> int:
    """The server's answer to GET `url` with `key` as the bearer token (None: no Authorization)."""
    request = urllib.request.Request(url)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def container_env(node: lab.LabNode, name: str) -> tuple[dict[str, str], str]:
    """A running container's environment, as the daemon stores it and as a process in it sees it
    (`docker exec env`; both must agree), and its command line."""
    inspected = json.loads(lab.docker(node, "inspect", name).out)[0]
    stored = dict(item.split("=", 1) for item in inspected["Config"]["Env"])
    lines = lab.docker(node, "exec", name, "env").out.splitlines()
    seen = dict(line.split("=", 1) for line in lines if "=" in line)
    for key in ("HF_TOKEN", "VLLM_API_KEY"):
        assert stored.get(key) == seen.get(key), (node.name, name, key)
    return stored, json.dumps([inspected["Path"], *inspected["Args"]])


def stack_container_ids(lab_nodes) -> dict[str, str]:
    """The lab stack's containers on node-a and node-b, by name: their Docker IDs."""
    where = (
        ("node-a", "qwen35-ray-head"),
        ("node-b", "qwen35-ray-worker"),
        ("node-a", "qwen35-vllm"),
        ("node-b", "qwen35-health-agent"),
        ("node-a", "qwen35-watchdog"),
    )
    return {
        name: lab.docker(lab_nodes[node], "inspect", "--format", "{{.Id}}", name).out.strip()
        for node, name in where
    }


def health_secret(lab_nodes) -> str:
    """The stack's health secret, as the watchdog and the agent hold it (both the same)."""
    # A file written into each container at its creation (never its environment).
    watchdog = lab.docker(
        lab_nodes["node-a"], "exec", "qwen35-watchdog", "cat", HEALTH_SECRET_FILE
    ).out.strip()
    agent = lab.docker(
        lab_nodes["node-b"], "exec", "qwen35-health-agent", "cat", HEALTH_SECRET_FILE
    ).out.strip()
    for node, name in (
        (lab_nodes["node-a"], "qwen35-watchdog"),
        (lab_nodes["node-b"], "qwen35-health-agent"),
    ):
        assert HEALTH_SECRET_ENV not in container_env(node, name)[0], name
    assert watchdog and len(watchdog) == 64 and watchdog == agent, "the watchdog and agent differ"
    return watchdog


def where_leaked(texts: dict[str, str], values: dict[str, str]) -> dict[str, list[str]]:
    """Each leak with the 300 characters before it (the value itself masked), to find its source."""
    found: dict[str, list[str]] = {}
    for key, value in values.items():
        for where, text in texts.items():
            at = text.find(value)
            if at >= 0:
                around = (
                    text[max(at - 300, 0) : at] + f"<{key}>" + text[at + len(value) : at + len(value) + 300]
                )
                found.setdefault(key, []).append(f"{where}: …{around!r}…")
    return found


def leaks(texts: dict[str, str], values: dict[str, str]) -> dict[str, list[str]]:
    """Which secret (by key) appears in plaintext in which text."""
    found = {key: [where for where, text in texts.items() if value in text] for key, value in values.items()}
    return {key: where for key, where in found.items() if where}


def require_clean(nodes: dict[str, lab.LabNode]) -> None:
    """No qwen35-* container on the nodes before a stack starts: one left by another session would
    make this one fail on a name, for a reason that is not this test's."""
    left = {name: sorted(node_state(node)["containers"]) for name, node in nodes.items()}
    left = {name: found for name, found in left.items() if found}
    if left:
        pytest.fail(f"the lab holds qwen35-* containers no stack of this session made: {left}", pytrace=False)


def backend_texts(engine) -> dict[str, str]:
    return {
        f"backend {path.relative_to(engine.backend)}": path.read_text(errors="replace")
        for path in Path(engine.backend).rglob("*")
        if path.is_file()
    }


# ---------------------------------------------------------------------------------------------------
# 4. Secrets never in the state, the logs or the display


class TestSecrets:
    """One stack on node-a/node-b with both secrets set, up, then the API key rotated."""

    @pytest.fixture(scope="class")
    @classmethod
    def stack(cls, engine, lab_nodes, lab_config, secrets) -> Iterator[Stack]:
        require_clean(lab_nodes)
        clear_caches(lab_nodes)
        with secret_stack(engine, "stacks-secrets", lab_config(), secrets) as made:
            yield made

    @pytest.fixture(scope="class")
    @classmethod
    def up(cls, stack) -> CliResult:
        return stack.run("up", "--yes", "--skip-preview", "--json", timeout=1800)

    def test_the_config_file_holds_only_ciphertext(self, stack, secrets):
        text = stack.config.read_text()
        assert not leaks({"Pulumi.stacks-secrets.yaml": text}, secrets)
        assert text.count("secure:") == 2, text

    def test_no_secret_in_state_events_display_or_outputs(self, up, stack, secrets, engine, lab_nodes):
        plain = stack.run("up", "--yes", "--skip-preview", "--expect-no-changes")
        # The health secret the program drew (HealthSecret): the containers hold it, nothing else.
        secrets = {**secrets, "health_secret": health_secret(lab_nodes)}
        texts = {
            "up --json": up.out + up.err,
            "up (plain display)": plain.out + plain.err,
            "stack output": stack.run("stack", "output").out,
            "stack output --json": stack.run("stack", "output", "--json").out,
            "stack export": stack.run("stack", "export").out,
            **backend_texts(engine),
        }
        assert not leaks(texts, secrets), where_leaked(texts, secrets)
        # The state holds them, encrypted: the engine knows they are secrets.
        exported = json.loads(texts["stack export"])
        assert '"4dabf18193072939515e22adb298388d"' in texts["stack export"]  # the secret signature
        assert exported["deployment"]["secrets_providers"]["type"] == "passphrase"

    def test_the_containers_have_them_and_the_server_requires_the_key(self, up, stack, lab_nodes, secrets):
        head, worker = lab_nodes["node-a"], lab_nodes["node-b"]
        server, argv = container_env(head, "qwen35-vllm")
        assert server.get("VLLM_API_KEY") == secrets["api_key"]
        assert server.get("HF_TOKEN") == secrets["hf_token"]
        assert not leaks({"qwen35-vllm argv": argv}, secrets)  # `ps` on the node shows argv
        for node, name in ((head, "qwen35-ray-head"), (worker, "qwen35-ray-worker")):
            env, argv = container_env(node, name)
            assert env.get("HF_TOKEN") == secrets["hf_token"], (node.name, name)
            assert not leaks({f"{name} argv": argv}, secrets)
            assert "VLLM_API_KEY" not in env, (node.name, name)  # only the server carries the key
        models = stack.run("stack", "output", "endpoint").out.strip() + "/models"
        assert http_status(models, None) == 401
        assert http_status(models, "sk-not-the-key") == 401
        assert http_status(models, secrets["api_key"]) == 200

    def test_a_new_api_key_replaces_only_what_carries_it(self, up, stack, lab_nodes, secrets, engine):
        old = secrets["api_key"]
        new = "sk-rotated-" + pysecrets.token_hex(12)
        ids_before = stack_container_ids(lab_nodes)
        stack.set_secret("api_key", new)
        # The plain display of the diff the rotation makes, then the change itself with its events.
        diff = stack.run("preview", "--diff")
        rotated = stack.run("up", "--yes", "--skip-preview", "--json", timeout=1800)
        events = rotated.events()
        steps = steps_by_resource(events)
        touched = changed(events)
        # The server's environment carries the key (a container's env is fixed at create: replaced);
        # the readiness gate probes with it (updated in place, or replaced with the server it follows);
        # the watchdog's completion probe carries it too. The agent and the health secret stay.
        held = health_secret(lab_nodes)
        assert set(touched) == {"qwen35-vllm", "qwen35-ready", "qwen35-watchdog"}, touched
        assert steps["qwen35-vllm"][0] == CONTAINER
        assert touched["qwen35-vllm"] & {"replace", "create-replacement"}, touched
        assert steps["qwen35-ready"][0] == GATE
        ids_after = stack_container_ids(lab_nodes)
        assert ids_after["qwen35-ray-head"] == ids_before["qwen35-ray-head"]
        assert ids_after["qwen35-ray-worker"] == ids_before["qwen35-ray-worker"]
        assert ids_after["qwen35-vllm"] != ids_before["qwen35-vllm"]
        assert ids_after["qwen35-health-agent"] == ids_before["qwen35-health-agent"]
        assert ids_after["qwen35-watchdog"] != ids_before["qwen35-watchdog"]
        assert health_secret(lab_nodes) == held
        assert container_env(lab_nodes["node-a"], "qwen35-vllm")[0]["VLLM_API_KEY"] == new
        watchdog_env = container_env(lab_nodes["node-a"], "qwen35-watchdog")[0]
        assert watchdog_env[HEALTH_API_KEY_ENV] == new
        models = stack.run("stack", "output", "endpoint").out.strip() + "/models"
        assert http_status(models, old) == 401
        assert http_status(models, new) == 200
        texts = {
            "preview --diff (plain display)": diff.out + diff.err,
            "up --json": rotated.out + rotated.err,
            "stack export": stack.run("stack", "export").out,
            "stack output --json": stack.run("stack", "output", "--json").out,
            **backend_texts(engine),
        }
        found = leaks(
            texts,
            {"old api_key": old, "new api_key": new, "hf_token": secrets["hf_token"], "health_secret": held},
        )
        assert not found, found
        secrets["api_key"] = new  # the stack's key from here on (the fixture is per session)


# ---------------------------------------------------------------------------------------------------
# 5. Two environments from one project

CD_NODES = (
    # name, address, image store, first of its Ray ports, its worker port range
    ("node-c", "127.0.0.4", "classic", 17141, (17600, 17699)),
    ("node-d", "127.0.0.5", "containerd", 17151, (17700, 17799)),
)
RAY_PORT_KEYS = (
    "node_manager_port",
    "object_manager_port",
    "metrics_export_port",
    "dashboard_agent_listen_port",
    "dashboard_agent_grpc_port",
    "runtime_env_agent_port",
)


def cd_config(base: dict, image: str) -> dict:
    """The lab config moved to node-c (classic store, head) and node-d (containerd store): its own
    Ray ports, GCS, dashboard and server ports and HF caches, since all nodes share one kernel."""
    config = copy.deepcopy(base)
    nodes = []
    for (name, host, store, first, (low, high)), role in zip(CD_NODES, ("head", "worker"), strict=True):
        ports = {key: first + i for i, key in enumerate(RAY_PORT_KEYS)}
        ports.update(min_worker_port=low, max_worker_port=high)
        nodes.append(
            {"name": name, "role": role, "host": host, "fabric_ip": host, "port": 2222, "gpus": 1}
            | {"docker_socket": str(lab_dir() / name / "docker.sock")}
            | ({"image_store": store} if store != "classic" else {})
            | {"ray_ports": ports}
        )
    config[f"{NAMESPACE}:nodes"] = nodes
    config[f"{NAMESPACE}:image"] = {**config[f"{NAMESPACE}:image"], "prebuilt": image}
    config[f"{NAMESPACE}:serve"] = {**config[f"{NAMESPACE}:serve"], "host": "127.0.0.4", "port": 18001}
    config[f"{NAMESPACE}:ray"] = {"port": 16380, "dashboard_port": 18266}
    model = dict(config[f"{NAMESPACE}:model"])
    model["cache_dirs"] = {name: str(lab_dir() / name / "hf-cache") for name, *_ in CD_NODES}
    config[f"{NAMESPACE}:model"] = model
    return config


@pytest.fixture(scope="module")
def all_nodes(lab_nodes) -> Iterator[dict[str, lab.LabNode]]:
    with contextlib.ExitStack() as stack:
        try:
            more = stack.enter_context(lab_session(["node-c", "node-d"]))
        except lab.LabError as exc:
            pytest.fail(f"the lab could not start node-c and node-d: {exc}", pytrace=False)
        yield {**lab_nodes, **more}


def node_state(node: lab.LabNode) -> dict[str, object]:
    """What a stack leaves on a node: qwen35-* containers (name -> ID), volumes, lab-ray tags, tag
    records (the claims NodeImage keeps in ~/.qwen35/tags)."""
    containers = dict(
        line.split(" ", 1)[::-1]
        for line in lab.docker(node, "ps", "-a", "--format", "{{.ID}} {{.Names}}").out.splitlines()
        if " qwen35-" in f" {line.split(' ', 1)[-1]}"
    )
    volumes = [
        v
        for v in lab.docker(node, "volume", "ls", "--format", "{{.Name}}").out.split()
        if v.startswith("qwen35-")
    ]
    tags = sorted(
        t
        for t in lab.docker(node, "images", "--format", "{{.Repository}}:{{.Tag}}").out.split()
        if t.startswith("lab-ray:")
    )
    records = {}
    folder = lab_dir() / node.name / "home" / ".qwen35" / "tags"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        records[path.name] = json.loads(path.read_text())
    return {"containers": containers, "volumes": volumes, "tags": tags, "records": records}


def run_status(engine, stack: str) -> tuple[int, dict]:
    """`python -m status --stack NAME --json` as an operator runs it, the engine's CLI on PATH (so it
    takes the API key from `pulumi config get --show-secrets`)."""
    env = {**engine.env(), "PATH": f"{engine.pulumi.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("QWEN35_API_KEY", None)
    done = subprocess.run(
        [sys.executable, "-m", "status", "--stack", stack, "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


class TestTwoEnvironments:
    """`lab-ab` (node-a/node-b, classic stores) and `lab-cd` (node-c classic, node-d containerd)."""

    @pytest.fixture(scope="class")
    @classmethod
    def stacks(cls, engine, all_nodes, lab_config, lab_image, secrets) -> Iterator[dict[str, Stack]]:
        require_clean(all_nodes)
        for name in all_nodes:
            shutil.rmtree(lab_dir() / name / "hf-cache", ignore_errors=True)
        cd_image, _ = ray_image(all_nodes["node-c"])
        assert cd_image == lab_image  # the same tag on both heads: each stack copies from its own head
        made = {
            "lab-ab": new_stack(engine, "lab-ab", lab_config()),
            "lab-cd": new_stack(engine, "lab-cd", cd_config(lab_config(), cd_image)),
        }
        for stack in made.values():
            stack.set_secret("api_key", secrets["api_key"])
        yield made
        for stack in made.values():
            stack.run("destroy", "--yes", check=False, timeout=900)
            stack.remove()

    @pytest.fixture(scope="class")
    @classmethod
    def ups(cls, stacks) -> dict[str, CliResult]:
        """Both `pulumi up` processes at once."""
        with ThreadPoolExecutor(2) as pool:
            running = {
                key: pool.submit(
                    stack.run, "up", "--yes", "--skip-preview", "--json", check=False, timeout=1800
                )
                for key, stack in stacks.items()
            }
            done = {key: future.result() for key, future in running.items()}
        for key, result in done.items():
            assert result.returncode == 0, (key, result.err[-4000:], result.out[-4000:])
        return done

    def test_both_serve_at_once_each_on_its_own_nodes(self, ups, stacks, all_nodes, secrets):
        expected = {
            "lab-ab": {
                "node-a": ["qwen35-ray-head", "qwen35-vllm", "qwen35-watchdog"],
                "node-b": ["qwen35-ray-worker", "qwen35-health-agent"],
            },
            "lab-cd": {
                "node-c": ["qwen35-ray-head", "qwen35-vllm", "qwen35-watchdog"],
                "node-d": ["qwen35-ray-worker", "qwen35-health-agent"],
            },
        }
        for key, stack in stacks.items():
            outputs = stack.run("stack", "output", "--json").json()
            assert outputs["containers"] == expected[key], (key, outputs["containers"])
            assert http_status(outputs["endpoint"] + "/models", secrets["api_key"]) == 200, key
        # Each stack's resources name only its own nodes (the engine's state, not the program's word).
        for key, stack in stacks.items():
            exported = json.loads(stack.run("stack", "export").out)
            text = json.dumps(exported["deployment"].get("resources") or [])
            others = ("127.0.0.4", "127.0.0.5") if key == "lab-ab" else ("127.0.0.2", "127.0.0.3")
            assert not [ip for ip in others if f"{ip}" in text], (key, [ip for ip in others if ip in text])
        for name, node in all_nodes.items():
            state = node_state(node)
            want = expected["lab-ab"].get(name) or expected["lab-cd"].get(name)
            assert sorted(state["containers"]) == sorted(want), (name, state)

    def test_status_reports_each_stack_alone(self, ups, engine):
        for key, own, other in (
            ("lab-ab", {"node-a", "node-b"}, {"node-c", "node-d"}),
            ("lab-cd", {"node-c", "node-d"}, {"node-a", "node-b"}),
        ):
            code, report = run_status(engine, key)
            assert code == 0 and report["ok"], (key, report.get("problems"))
            assert set(report["nodes"]) == own, (key, report["nodes"])
            assert not other & set(report["facts"].get("nodes", {})), key

    def test_a_third_stack_on_the_same_nodes_is_refused_before_it_touches_them(
        self, ups, stacks, engine, all_nodes, lab_config, secrets
    ):
        ab = ("node-a", "node-b")
        before = {name: node_state(all_nodes[name]) for name in ab}
        again = new_stack(engine, "lab-ab-again", lab_config())  # lab-ab's nodes, prefix and ports
        try:
            refused = again.run("up", "--yes", "--skip-preview", "--json", check=False, timeout=900)
            text = refused.out + refused.err
            assert refused.returncode != 0, text[-3000:]
            assert "stack qwen35-spark/lab-ab-again cannot deploy here" in text, text[-3000:]
            assert "stack qwen35-spark/lab-ab: containers qwen35-*; ports " in text, text[-3000:]
            created = {typ for typ, _, op in finished(refused.events()) if op == "create"}
            assert created <= {"pulumi:pulumi:Stack", "qwen35:index:Deployment", PROVIDER}, created
            assert {name: node_state(all_nodes[name]) for name in ab} == before
            again.run("destroy", "--yes", timeout=600)
            assert {name: node_state(all_nodes[name]) for name in ab} == before
        finally:
            again.run("destroy", "--yes", check=False, timeout=600)
            again.remove()
        endpoint = stacks["lab-ab"].run("stack", "output", "endpoint").out.strip()
        assert http_status(endpoint + "/models", secrets["api_key"]) == 200

    def test_destroying_one_leaves_the_other_serving(self, ups, stacks, all_nodes, engine, secrets):
        before = {name: node_state(node) for name, node in all_nodes.items()}
        stacks["lab-cd"].run("destroy", "--yes", timeout=900)
        after = {name: node_state(node) for name, node in all_nodes.items()}
        for name in ("node-a", "node-b"):
            assert after[name] == before[name], (name, before[name], after[name])
        for name in ("node-c", "node-d"):
            # Only the compile cache stays, kept as the checkpoint is (model.keep_on_destroy).
            assert after[name]["containers"] == {}, (name, after[name])
            assert after[name]["volumes"] == ["qwen35-compile-cache"], (name, after[name])
        assert after["node-d"]["tags"] == [], after["node-d"]  # placed by lab-cd, removed by it
        endpoint = stacks["lab-ab"].run("stack", "output", "endpoint").out.strip()
        assert http_status(endpoint + "/models", secrets["api_key"]) == 200
        code, report = run_status(engine, "lab-ab")
        assert code == 0 and report["ok"], report.get("problems")
        noop = stacks["lab-ab"].run(
            "refresh", "--yes", "--skip-preview", "--expect-no-changes", "--json", check=False
        )
        assert noop.returncode == 0, changed(noop.events()) or noop.err[-3000:]
