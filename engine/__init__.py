"""The real Pulumi engine for this project: the CLI and plugins built from Go modules, run offline.

`ensure_engine()` runs engine/build.sh (which builds into `${QWEN35_CACHE:-~/.cache/qwen35-spark}/engine/`
once and reuses the build, or picks a suitable `pulumi` already on PATH), installs the Docker provider
into a `PULUMI_HOME` under that cache, and returns an `Engine` whose `run()` calls the CLI with a
local file backend (`.pulumi-state/` in the checkout, ignored by git), the passphrase secrets
provider, and no update check or plugin download. Used by `make up` / `make down` (engine/__main__.py),
the engine tier (tests/engine/) and `make bench`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "engine" / "build.sh"
# The version pulumi-docker==5.2.0 (requirements.txt) registers its resources with.
DOCKER_PLUGIN = ("docker", "5.2.0")
# The lab's stacks are throwaway: their passphrase only has to be the same on every run.
LAB_PASSPHRASE = "qwen35-lab"


class EngineError(RuntimeError):
    """The engine could not be built or a CLI command failed; the message says which and what to do."""


def cache_root() -> Path:
    return Path(os.environ.get("QWEN35_CACHE") or "~/.cache/qwen35-spark").expanduser() / "engine"


@dataclass(frozen=True)
class CliResult:
    """One CLI run: its argv, exit status, output, and wall time."""

    argv: tuple[str, ...]
    returncode: int
    out: str
    err: str
    seconds: float

    def json(self):
        """stdout parsed as JSON (`--json` output)."""
        return json.loads(self.out)

    def events(self) -> list[dict]:
        """stdout as the newline-delimited engine events of `--json` on up/refresh/destroy."""
        return [json.loads(line) for line in self.out.splitlines() if line.strip().startswith("{")]


@dataclass(frozen=True)
class Engine:
    """The CLI to run, where its plugins and state live, and how it was obtained."""

    pulumi: Path
    home: Path
    backend: Path
    origin: str
    passphrase: str = LAB_PASSPHRASE

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PULUMI_HOME=str(self.home),
            PULUMI_BACKEND_URL=f"file://{self.backend}",
            PULUMI_CONFIG_PASSPHRASE=self.passphrase,
            PULUMI_SKIP_UPDATE_CHECK="true",
            PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true",
            # Only the plugins installed into PULUMI_HOME (and those next to the CLI): never a stray one.
            PULUMI_IGNORE_AMBIENT_PLUGINS="true",
            PULUMI_SKIP_CONFIRMATIONS="true",
        )
        env.pop("PULUMI_ACCESS_TOKEN", None)
        env.pop("PULUMI_CONFIG_PASSPHRASE_FILE", None)
        return env

    def run(
        self,
        *args: str,
        stack: str | None = None,
        cwd: Path = ROOT,
        check: bool = True,
        timeout: float = 1800,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
    ) -> CliResult:
        argv = [str(self.pulumi), *args, "--non-interactive"]
        if stack:
            argv += ["--stack", stack]
        started = time.monotonic()
        done = subprocess.run(
            argv,
            cwd=cwd,
            env={**self.env(), **(env or {})},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        result = CliResult(tuple(argv), done.returncode, done.stdout, done.stderr, time.monotonic() - started)
        if check and done.returncode != 0:
            tail = "\n".join((done.stderr.strip() or done.stdout.strip()).splitlines()[-25:])
            raise EngineError(f"pulumi {' '.join(args)} failed (exit {done.returncode}):\n{tail}")
        return result


def build() -> tuple[Path, str, list[str]]:
    """Run engine/build.sh: (the folder with the CLI and plugins, where it came from, its lines)."""
    done = subprocess.run(["sh", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    lines = done.stdout.splitlines()
    if done.returncode != 0:
        tail = "\n".join((done.stderr.strip() or done.stdout.strip()).splitlines()[-30:])
        raise EngineError(f"make engine failed (exit {done.returncode}):\n{tail}")
    found = [m for line in lines if (m := re.match(r"engine: bin=(\S+)(?: \((.*)\))?$", line))]
    if not found:
        raise EngineError("make engine printed no 'engine: bin=' line:\n" + done.stdout)
    return Path(found[-1].group(1)), found[-1].group(2) or "built from Go modules", lines


def install_plugin(engine: Engine, binary: Path, kind: str, name: str, version: str) -> None:
    """Put a provider binary into PULUMI_HOME's plugin cache, once per binary (by size and mtime)."""
    marker = engine.home / "plugins" / f".{kind}-{name}-v{version}.installed"
    stamp = f"{binary} {binary.stat().st_size} {binary.stat().st_mtime_ns}"
    if marker.exists() and marker.read_text() == stamp:
        return
    engine.run("plugin", "install", kind, name, version, "--file", str(binary), "--reinstall")
    marker.write_text(stamp)


def ensure_engine(backend: Path | None = None) -> Engine:
    """The engine, built or found, with the Docker provider installed; `backend`: the state folder."""
    bin_dir, origin, _ = build()
    home = cache_root() / "home"
    (home / "plugins").mkdir(parents=True, exist_ok=True)
    state = backend or ROOT / ".pulumi-state"
    state.mkdir(parents=True, exist_ok=True)
    engine = Engine(pulumi=bin_dir / "pulumi", home=home, backend=state, origin=origin)
    provider = bin_dir / f"pulumi-resource-{DOCKER_PLUGIN[0]}"
    if not provider.exists():
        raise EngineError(f"{provider} is missing: run `make engine` (engine/build.sh builds it)")
    install_plugin(engine, provider, "resource", *DOCKER_PLUGIN)
    return engine
