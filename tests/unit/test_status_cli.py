"""`status` reads the stack outputs with a `pulumi` on PATH, else with the CLI `make engine` built,
run as `make up` runs it (the checkout's file backend, the lab's passphrase)."""

from __future__ import annotations

import os
import time

import engine
from engine.__main__ import state_dir
from status import gather

# The fake CLI prints what `make up`'s engine would be given, then the output it was asked for.
REPORTS_ENV = (
    '[ "$1 $2 $3 $4 $5 $6" = "stack output serve_bench --json --stack lab-engine" ] || exit 255\n'
    'echo "{\\"backend\\": \\"$PULUMI_BACKEND_URL\\", \\"passphrase\\": \\"$PULUMI_CONFIG_PASSPHRASE\\", '
    '\\"home\\": \\"$PULUMI_HOME\\", \\"from\\": \\"$0\\"}"\n'
)


def built(cache, key: str, script: str, complete: bool = True):
    """A CLI where `make engine` leaves one: <cache>/engine/<key>/bin/pulumi, `.complete` once done."""
    folder = cache / "engine" / key
    (folder / "bin").mkdir(parents=True)
    cli = folder / "bin" / "pulumi"
    cli.write_text("#!/bin/sh\n" + script)
    cli.chmod(0o755)
    if complete:
        (folder / ".complete").write_text("built")
    return cli


def test_without_pulumi_on_path_the_engine_s_cli_reads_what_make_up_recorded(tmp_path):
    cli = built(tmp_path, "pulumi-v3.274.1-ours-abc", REPORTS_ENV)
    env = {"QWEN35_CACHE": str(tmp_path)}
    got = gather.stack_bench("lab-engine", cwd=tmp_path, which=lambda _: None, env=env)
    assert got == {
        "output": {
            "backend": f"file://{gather.ROOT / '.pulumi-state'}",
            "passphrase": "qwen35-lab",
            "home": str(tmp_path / "engine" / "home"),
            "from": str(cli),
        }
    }


def test_the_operator_s_backend_and_passphrase_win(tmp_path):
    built(tmp_path, "pulumi-v3.274.1-ours-abc", REPORTS_ENV)
    env = {"QWEN35_CACHE": str(tmp_path), "PULUMI_BACKEND_URL": "s3://ours", "PULUMI_CONFIG_PASSPHRASE": "p"}
    got = gather.stack_bench("lab-engine", cwd=tmp_path, which=lambda _: None, env=env)["output"]
    assert (got["backend"], got["passphrase"]) == ("s3://ours", "p")
    env = {"QWEN35_CACHE": str(tmp_path), "PULUMI_BACKEND_URL": "s3://ours"}
    assert (
        gather.stack_bench("lab-engine", cwd=tmp_path, which=lambda _: None, env=env)["output"]["passphrase"]
        == ""
    )


def test_a_pulumi_on_path_comes_first_and_runs_in_our_environment(tmp_path):
    built(tmp_path, "pulumi-v3.274.1-ours-abc", REPORTS_ENV)
    env = {"QWEN35_CACHE": str(tmp_path)}
    assert gather.pulumi_cli(lambda _: "/usr/bin/pulumi", env) == gather.PulumiCli("/usr/bin/pulumi", None)


def test_the_newest_finished_build_is_used(tmp_path):
    old = built(tmp_path, "pulumi-v3.270.0-ours-old", "")
    os.utime(old.parent.parent / ".complete", (time.time() - 3600,) * 2)
    new = built(tmp_path, "pulumi-v3.274.1-ours-new", "")
    built(tmp_path, "pulumi-v3.280.0-ours-half", "", complete=False)  # a build that stopped midway
    assert gather.pulumi_cli(lambda _: None, {"QWEN35_CACHE": str(tmp_path)}).path == str(new)


def test_with_neither_the_error_says_where_it_looked(tmp_path):
    built(tmp_path, "pulumi-v3.274.1-ours-half", REPORTS_ENV, complete=False)
    env = {"QWEN35_CACHE": str(tmp_path)}
    got = gather.stack_fabric("lab-engine", cwd=tmp_path, which=lambda _: None, env=env)
    assert got == {
        "error": "no Pulumi CLI here (none on PATH, none built by `make engine` under "
        f"{tmp_path / 'engine'}) to read the stack output `fabric`"
    }


def test_the_api_key_comes_from_the_engine_s_cli_too(tmp_path):
    built(
        tmp_path,
        "pulumi-v3.274.1-ours-abc",
        '[ "$PULUMI_CONFIG_PASSPHRASE $4" = "qwen35-lab qwen35-spark:api_key" ] && echo sk-cli\n',
    )
    env = {"QWEN35_CACHE": str(tmp_path)}
    assert gather.api_key("lab-engine", cwd=tmp_path, env=env, which=lambda _: None) == (
        "sk-cli",
        "pulumi config",
    )


def test_status_looks_where_the_engine_builds_and_keeps_its_state(monkeypatch, tmp_path):
    # status ships without engine/ (a development folder), so it holds these itself; they must agree.
    monkeypatch.setenv("QWEN35_CACHE", str(tmp_path))
    assert gather.engine_cache() == engine.cache_root()
    assert gather.ENGINE_PASSPHRASE == engine.LAB_PASSPHRASE
    assert state_dir() == gather.ENGINE_STATE
