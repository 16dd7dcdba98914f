"""Dynamic resources driven the way the Pulumi engine drives them, without the Pulumi CLI.

`pulumi up` never calls a dynamic provider's methods in the program's process. The program registers
the resource with its provider pickled by the SDK (`serialize_provider`, dill) into the `__provider`
input; the engine starts `python -m pulumi.dynamic` in the project directory, reads the port it
prints, and calls Configure, Check, Diff, Create, Read, Update and Delete over gRPC with properties
marshalled as protobuf Structs. `ProviderHost` is that engine side: a fresh provider process and a
gRPC client to it. `Engine` adds the engine's step order on top (check then create; check, diff, then
update or replace, the new resource first unless the provider asks for delete-before-replace).

Secrets: the dynamic provider answers Configure with `acceptSecrets: false`, so the engine strips
secret markers before sending properties and marks outputs secret itself. The harness does the same
and records which keys were secret (`State.secret_keys`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import struct_pb2
from pulumi.runtime import rpc
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent.parent
PROVIDER_KEY = "__provider"
# How long the provider process may take to import the SDK and print its port.
START_DEADLINE_S = 60.0
# A generous bound for one call; a create that copies an image or waits for a server sets its own.
CALL_DEADLINE_S = 600.0


class ProviderFailed(RuntimeError):
    """A provider call failed in the provider process; the message carries its traceback."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str):
        self.method = method
        self.code = code
        self.details = details
        super().__init__(f"{method} failed in the provider process ({code.name}):\n{details}")


class CheckFailed(RuntimeError):
    """Check answered with failures, as `pulumi preview` would show them."""

    def __init__(self, failures: list[tuple[str, str]]):
        self.failures = failures
        super().__init__("; ".join(f"{prop}: {reason}" for prop, reason in failures))


@dataclass(frozen=True)
class DiffAnswer:
    """What Diff said: changes ('none' | 'some' | 'unknown'), the replacing keys, the replace order."""

    changes: str
    replaces: tuple[str, ...] = ()
    delete_before_replace: bool = False

    @property
    def replace(self) -> bool:
        return bool(self.replaces)


_CHANGES = {
    provider_pb2.DiffResponse.DIFF_NONE: "none",
    provider_pb2.DiffResponse.DIFF_SOME: "some",
    provider_pb2.DiffResponse.DIFF_UNKNOWN: "unknown",
}


def is_secret(value: Any) -> bool:
    return rpc.is_rpc_secret(value)


def reveal(value: Any) -> Any:
    """`value` with every secret marker removed (what the engine sends a provider without secrets)."""
    if rpc.is_rpc_secret(value):
        return reveal(rpc.unwrap_rpc_secret(value))
    if isinstance(value, Mapping):
        return {k: reveal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [reveal(v) for v in value]
    return value


def contains_secret(value: Any) -> bool:
    if rpc.is_rpc_secret(value):
        return True
    if isinstance(value, Mapping):
        return any(contains_secret(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(contains_secret(v) for v in value)
    return False


def to_struct(props: Mapping[str, Any]) -> struct_pb2.Struct:
    """Plain properties as the wire Struct, through the SDK's own marshalling (`rpc.serialize_properties`)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(rpc.serialize_properties(dict(props), {}))
    finally:
        loop.close()


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A wire Struct back to Python values (`rpc.deserialize_properties`, unknowns kept)."""
    return dict(rpc.deserialize_properties(struct, keep_unknowns=True))


class ProviderHost:
    """A fresh `python -m pulumi.dynamic` process in the project directory and the engine's client to it."""

    def __init__(self, cwd: Path = ROOT, env: Mapping[str, str] | None = None):
        self.cwd = cwd
        self.env = dict(os.environ if env is None else env)
        self.process: subprocess.Popen | None = None
        self.channel: grpc.Channel | None = None
        self.stub: provider_pb2_grpc.ResourceProviderStub | None = None
        self.port: int | None = None
        self.accepts_secrets: bool | None = None
        # Closed with the harness; the provider writes into it for its whole life.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._stderr_text = ""

    # ---- process ---------------------------------------------------------------------------------

    def start(self) -> ProviderHost:
        # -u as the SDK's plugin launcher does: the port line must not sit in a buffer.
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-m", "pulumi.dynamic"],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self.port = self._read_port()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        grpc.channel_ready_future(self.channel).result(timeout=START_DEADLINE_S)
        self.stub = provider_pb2_grpc.ResourceProviderStub(self.channel)
        # The engine configures every provider before its first resource call.
        answer = self._call(
            "Configure", provider_pb2.ConfigureRequest(acceptSecrets=True, acceptResources=True)
        )
        self.accepts_secrets = answer.acceptSecrets
        return self

    def _read_port(self) -> int:
        assert self.process is not None and self.process.stdout is not None
        line: list[bytes] = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_DEADLINE_S)
        text = line[0].decode(errors="replace").strip() if line else ""
        if not text.isdigit():
            self.close()
            raise RuntimeError(
                f"`python -m pulumi.dynamic` in {self.cwd} printed no port within {START_DEADLINE_S:.0f} s "
                f"(got {text!r}); its stderr:\n{self.stderr}"
            )
        return int(text)

    @property
    def stderr(self) -> str:
        """Everything the provider process wrote to stderr (where `pulumi.log` falls back to)."""
        if self._stderr.closed:
            return self._stderr_text
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if not self._stderr.closed:
            self._stderr_text = self.stderr
            self._stderr.close()

    def __enter__(self) -> ProviderHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the ResourceProvider calls ----------------------------------------------------------------

    def _call(self, method: str, request: Any, timeout: float = CALL_DEADLINE_S) -> Any:
        if self.stub is None:
            raise RuntimeError("ProviderHost: start() it first")
        try:
            return getattr(self.stub, method)(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise ProviderFailed(method, exc.code(), exc.details() or "") from None

    def check(self, urn: str, olds: Mapping[str, Any], news: Mapping[str, Any]) -> dict[str, Any]:
        answer = self._call(
            "Check", provider_pb2.CheckRequest(urn=urn, olds=to_struct(olds), news=to_struct(news))
        )
        if answer.failures:
            raise CheckFailed([(f.property, f.reason) for f in answer.failures])
        return from_struct(answer.inputs)

    def diff(
        self,
        urn: str,
        id_: str,
        olds: Mapping[str, Any],
        news: Mapping[str, Any],
        old_inputs: Mapping[str, Any],
    ) -> DiffAnswer:
        answer = self._call(
            "Diff",
            provider_pb2.DiffRequest(
                id=id_, urn=urn, olds=to_struct(olds), news=to_struct(news), old_inputs=to_struct(old_inputs)
            ),
        )
        return DiffAnswer(_CHANGES[answer.changes], tuple(answer.replaces), answer.deleteBeforeReplace)

    def create(
        self, urn: str, inputs: Mapping[str, Any], timeout: float = CALL_DEADLINE_S
    ) -> tuple[str, dict]:
        answer = self._call(
            "Create",
            provider_pb2.CreateRequest(urn=urn, properties=to_struct(inputs), timeout=timeout),
            timeout,
        )
        return answer.id, from_struct(answer.properties)

    def read(
        self,
        urn: str,
        id_: str,
        outputs: Mapping[str, Any],
        inputs: Mapping[str, Any],
        timeout: float = CALL_DEADLINE_S,
    ) -> tuple[str, dict, dict | None]:
        answer = self._call(
            "Read",
            provider_pb2.ReadRequest(
                id=id_, urn=urn, properties=to_struct(outputs), inputs=to_struct(inputs)
            ),
            timeout,
        )
        new_inputs = from_struct(answer.inputs) if answer.HasField("inputs") else None
        return answer.id, from_struct(answer.properties), new_inputs

    def update(
        self,
        urn: str,
        id_: str,
        olds: Mapping[str, Any],
        news: Mapping[str, Any],
        old_inputs: Mapping[str, Any],
        timeout: float = CALL_DEADLINE_S,
    ) -> dict:
        answer = self._call(
            "Update",
            provider_pb2.UpdateRequest(
                id=id_,
                urn=urn,
                olds=to_struct(olds),
                news=to_struct(news),
                old_inputs=to_struct(old_inputs),
                timeout=timeout,
            ),
            timeout,
        )
        return from_struct(answer.properties)

    def delete(
        self,
        urn: str,
        id_: str,
        outputs: Mapping[str, Any],
        old_inputs: Mapping[str, Any],
        timeout: float = CALL_DEADLINE_S,
    ) -> None:
        self._call(
            "Delete",
            provider_pb2.DeleteRequest(
                id=id_,
                urn=urn,
                properties=to_struct(outputs),
                old_inputs=to_struct(old_inputs),
                timeout=timeout,
            ),
            timeout,
        )


@dataclass(frozen=True)
class State:
    """What the engine keeps for one resource between operations (the stack's checkpoint entry)."""

    urn: str
    id: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    secret_keys: frozenset[str] = field(default_factory=frozenset)

    @property
    def exists(self) -> bool:
        return bool(self.id)

    def public_outputs(self) -> dict[str, Any]:
        """The outputs without the pickled provider (what a stack output or a test looks at)."""
        return {k: v for k, v in self.outputs.items() if k != PROVIDER_KEY}


def urn_of(stack: str, project: str, typ: str, name: str) -> str:
    return f"urn:pulumi:{stack}::{project}::{typ}::{name}"


@dataclass(frozen=True)
class UpResult:
    """One resource's step in an `up`: 'same' | 'update' | 'replace', and the state after it."""

    op: str
    state: State
    diff: DiffAnswer | None = None


class Engine:
    """The engine's step order for dynamic resources, over a `ProviderHost`.

    `registered` inputs are what the program registered (secret markers included, `__provider` the
    SDK's pickled provider): exactly what the engine receives from the language host.
    """

    def __init__(self, host: ProviderHost, stack: str = "lab", project: str = "qwen35-spark"):
        self.host = host
        self.stack = stack
        self.project = project

    def urn(self, typ: str, name: str) -> str:
        return urn_of(self.stack, self.project, typ, name)

    def create(
        self, typ: str, name: str, registered: Mapping[str, Any], timeout: float = CALL_DEADLINE_S
    ) -> State:
        """`pulumi up` of a new resource: Check, then Create with the checked inputs."""
        if PROVIDER_KEY not in registered:
            raise ValueError(
                f"{name}: the registered inputs carry no {PROVIDER_KEY} (not a dynamic resource?)"
            )
        urn = self.urn(typ, name)
        secret_keys = frozenset(k for k, v in registered.items() if contains_secret(v))
        inputs = self.host.check(urn, {}, reveal(registered))
        id_, outputs = self.host.create(urn, inputs, timeout)
        return State(urn, id_, inputs, outputs, secret_keys)

    def up(self, state: State, registered: Mapping[str, Any], timeout: float = CALL_DEADLINE_S) -> UpResult:
        """`pulumi up` of an existing resource with new registered inputs: Check, Diff, then nothing,
        Update, or a replacement (create the new one, then delete the old, unless the provider asks
        for delete-before-replace)."""
        secret_keys = frozenset(k for k, v in registered.items() if contains_secret(v))
        inputs = self.host.check(state.urn, state.inputs, reveal(registered))
        answer = self.host.diff(state.urn, state.id, state.outputs, inputs, state.inputs)
        if answer.changes == "none":
            return UpResult("same", State(state.urn, state.id, inputs, state.outputs, secret_keys), answer)
        if not answer.replace:
            outputs = self.host.update(state.urn, state.id, state.outputs, inputs, state.inputs, timeout)
            return UpResult("update", State(state.urn, state.id, inputs, outputs, secret_keys), answer)
        if answer.delete_before_replace:
            self.delete(state, timeout)
            id_, outputs = self.host.create(state.urn, inputs, timeout)
        else:
            id_, outputs = self.host.create(state.urn, inputs, timeout)
            self.delete(state, timeout)
        return UpResult("replace", State(state.urn, id_, inputs, outputs, secret_keys), answer)

    def refresh(self, state: State, timeout: float = CALL_DEADLINE_S) -> State:
        """`pulumi refresh`: Read with the recorded outputs and inputs; an empty id means gone."""
        id_, outputs, inputs = self.host.read(state.urn, state.id, state.outputs, state.inputs, timeout)
        return State(
            state.urn, id_, inputs if inputs is not None else state.inputs, outputs, state.secret_keys
        )

    def delete(self, state: State, timeout: float = CALL_DEADLINE_S) -> None:
        """`pulumi destroy` of one resource (or the old half of a replacement)."""
        self.host.delete(state.urn, state.id, state.outputs, state.inputs, timeout)
