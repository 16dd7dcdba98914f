"""Carry the base image's cluster layer (Ray, and the system NCCL its pip NCCL points to) onto the
donor's complete vLLM (stdlib only: it runs with each image's own python).

  export --out DIR   in a stage FROM the base, with the base's python: Ray's version and installed
                     extras, the installed distributions Ray needs (its requirement closure, files as
                     listed in their RECORD), the Python ABI, and where the pip NCCL library points;
  apply --staged DIR in the stage FROM the donor, with the donor's python: copy Ray when both
                     Pythons share an ABI (same cache tag, SOABI and machine, the donor's glibc no
                     older), else `pip install ray[extras]==<base's>` with the donor's installed
                     packages as constraints (PIP_ARGS reach an index or a wheel folder); place the
                     base's system NCCL at its path and point the donor's pip NCCL at it.
`apply` writes what it did to --report (JSON) and prints one line per decision. Exit 0 done, 1 the
cluster layer cannot be carried (the message names the missing piece), 2 usage.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
# The pip wheel's NCCL, relative to a site-packages folder (nvidia-nccl-cu12 / -cu13).
PIP_NCCL = os.path.join("nvidia", "nccl", "lib", "libnccl.so.2")
EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class Refused(Exception):
    """The cluster layer cannot be carried over; the message says what is missing and what to do."""


def say(message: str) -> None:
    print(f"graft: {message}", flush=True)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- facts of one image's python ------------------------------------------------------------------


def python_facts() -> dict:
    """What decides whether compiled packages of one image load in the other's interpreter."""
    libc, version = platform.libc_ver()
    return {
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "executable": sys.executable,
        "cache_tag": sys.implementation.cache_tag,
        "soabi": sysconfig.get_config_var("SOABI"),
        "machine": platform.machine(),
        "libc": libc,
        "glibc": version,
        "purelib": sysconfig.get_paths()["purelib"],
        "scripts": sysconfig.get_paths()["scripts"],
    }


def installed(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def requirements(dist: importlib.metadata.Distribution, extras: set[str]) -> list[str]:
    """Names `dist` requires with `extras`: other markers are not evaluated (only what is installed
    is carried, and an install that pip made has already evaluated them)."""
    names = []
    for line in dist.requires or []:
        requirement, _, marker = line.partition(";")
        wanted_extras = set(EXTRA_MARKER.findall(marker))
        if wanted_extras and not wanted_extras & extras:
            continue
        found = NAME.match(requirement)
        if found:
            names.append(found.group(1))
    return names


def installed_extras(dist: importlib.metadata.Distribution) -> list[str]:
    """The extras of `dist` whose every requirement is installed here (what `ray[default]` brought)."""
    extras = []
    for extra in dist.metadata.get_all("Provides-Extra") or []:
        needed = set(requirements(dist, {extra})) - set(requirements(dist, set()))
        if needed and all(installed(name) for name in needed):
            extras.append(extra)
    return sorted(extras)


def closure(root: importlib.metadata.Distribution, extras: set[str]) -> list[importlib.metadata.Distribution]:
    """`root` and every installed distribution it needs, transitively (each once)."""
    seen: dict[str, importlib.metadata.Distribution] = {canonical(root.metadata["Name"]): root}
    queue = [(root, extras)]
    while queue:
        dist, with_extras = queue.pop()
        for name in requirements(dist, with_extras):
            if canonical(name) in seen:
                continue
            found = installed(name)
            if found is not None:
                seen[canonical(name)] = found
                queue.append((found, set()))
    return [seen[key] for key in sorted(seen)]


def pip_nccl() -> str | None:
    """The pip NCCL library on this interpreter's path, if any."""
    for folder in sys.path:
        candidate = os.path.join(folder or ".", PIP_NCCL)
        if os.path.lexists(candidate):
            return candidate
    return None


def link_chain(path: str) -> list[dict]:
    """`path` and the links it goes through to a file: [{path, link}…, {path, file}]."""
    chain, seen = [], set()
    while os.path.islink(path) and path not in seen:
        seen.add(path)
        target = os.readlink(path)
        chain.append({"path": path, "link": target})
        path = os.path.normpath(os.path.join(os.path.dirname(path), target))
    chain.append({"path": path, "file": True})
    return chain


# ---- export (in the base) -------------------------------------------------------------------------


def export(out: str) -> dict:
    ray = installed("ray")
    if ray is None:
        raise Refused(
            f"the base image has no Ray in {sys.executable}: graft takes Ray from the base; "
            "use the base that runs the Sparks' Ray cluster (vllm-node)"
        )
    extras = installed_extras(ray)
    site = os.path.join(out, "site")
    dists = []
    for dist in closure(ray, set(extras)):
        location = str(dist.locate_file(""))
        files = []
        for entry in dist.files or []:
            rel = entry.as_posix()
            # Scripts live outside site-packages with the base's shebang: `apply` writes its own.
            if rel.startswith("../") or rel.startswith("/") or "__pycache__/" in rel or rel.endswith(".pyc"):
                continue
            source = os.path.join(location, rel)
            if not os.path.isfile(source):
                continue
            target = os.path.join(site, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=True)
            files.append(rel)
        scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
        dists.append(
            {"name": dist.metadata["Name"], "version": dist.version, "files": files, "scripts": scripts}
        )
    facts = {**python_facts(), "ray": ray.version, "extras": extras, "dists": dists, "nccl": export_nccl(out)}
    with open(os.path.join(out, "facts.json"), "w", encoding="utf-8") as handle:
        json.dump(facts, handle, indent=1)
    size = sum(len(d["files"]) for d in dists)
    say(
        f"base: Ray {ray.version} [{','.join(extras) or 'no extras'}] for {facts['cache_tag']} "
        f"{facts['machine']} ({len(dists)} distributions, {size} files); NCCL: {facts['nccl']['summary']}"
    )
    return facts


def export_nccl(out: str) -> dict:
    """What the base does about NCCL: a pip NCCL that links to a system build is carried."""
    pip_lib = pip_nccl()
    if pip_lib is None:
        return {"mode": "none", "summary": "no pip NCCL in the base: nothing to carry"}
    if not os.path.islink(pip_lib):
        return {"mode": "pip", "summary": "the base uses the pip-bundled NCCL as installed: nothing to carry"}
    chain = link_chain(pip_lib)[1:]  # the pip path itself is the donor's to re-point
    real = chain[-1]["path"]
    if not os.path.isfile(real):
        return {"mode": "broken", "summary": f"the base's pip NCCL links to {real}, which is missing"}
    for step in chain:
        target = os.path.join(out, "nccl", step["path"].lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if "link" in step:
            os.symlink(step["link"], target)
        else:
            shutil.copy2(step["path"], target)
    return {
        "mode": "system",
        "chain": chain,
        "summary": f"the base's pip NCCL links to the system NCCL {chain[0]['path']} ({real}): carried",
    }


# ---- apply (in the donor) -------------------------------------------------------------------------


def abi_decision(base: dict, head: dict) -> tuple[str, str]:
    """("copy" | "install", why): copy only where the base's compiled files load in the donor."""
    differences = [
        f"{key} {base.get(key)} vs {head.get(key)}"
        for key in ("cache_tag", "soabi", "machine", "libc")
        if base.get(key) != head.get(key)
    ]
    if not differences and _version(head.get("glibc")) < _version(base.get("glibc")):
        differences.append(
            f"the donor's glibc {head.get('glibc')} is older than the base's {base.get('glibc')}"
        )
    if differences:
        return "install", "the two Pythons' ABI differ (base vs donor: " + "; ".join(differences) + ")"
    return "copy", f"both Pythons are {head['cache_tag']} {head['soabi']} on {head['machine']}"


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or ""))


def copy_ray(staged: str, base: dict, head: dict) -> dict:
    """The base's Ray closure into the donor's site-packages; distributions the donor has are kept."""
    copied, kept = [], []
    for dist in base["dists"]:
        have = installed(dist["name"])
        if have is not None:
            kept.append(f"{dist['name']} {have.version} (base: {dist['version']})")
            continue
        for rel in dist["files"]:
            target = os.path.join(head["purelib"], rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(os.path.join(staged, "site", rel), target)
        for name, value in dist["scripts"].items():
            write_script(head["scripts"], name, value)
        copied.append(f"{dist['name']} {dist['version']}")
    return {"copied": copied, "kept": kept}


def write_script(folder: str, name: str, value: str) -> None:
    """A console script for the donor's python (the base's carry the base's shebang)."""
    module, _, attr = value.partition(":")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(
            f"#!{sys.executable}\n# Written by qwen35-spark's graft (Ray carried from the base image).\n"
            f"import sys\nfrom {module} import {attr.split('.')[0]}\n"
            f"sys.exit({attr}())\n"
        )
    os.chmod(path, 0o755)


def install_ray(base: dict, pip_args: str, why: str) -> dict:
    """`pip install ray[extras]==<base's>`, every package the donor has held where it is."""
    spec = f"ray[{','.join(base['extras'])}]=={base['ray']}" if base["extras"] else f"ray=={base['ray']}"
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=False
    )
    if frozen.returncode != 0:
        raise Refused(f"the donor's python has no working pip ({frozen.stderr.strip()[-300:]}): {why}")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write(frozen.stdout)
    argv = [sys.executable, "-m", "pip", "install", "--no-cache-dir", *shlex.split(pip_args), "-c",
            constraints.name, spec]  # fmt: skip
    say(f"installing {spec} ({why}): {' '.join(argv[3:])}")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    os.unlink(constraints.name)
    print(done.stdout[-3000:], end="")
    if done.returncode != 0:
        raise Refused(
            f"Ray {base['ray']} could not be installed in the donor (exit {done.returncode}); the base's "
            f"Ray cannot be copied because {why}: give image.pip_args an index that serves {spec} for "
            f"{sys.implementation.cache_tag} on {platform.machine()}, or put its wheels in patches/wheels/ "
            f"(pip said: {' | '.join(done.stderr.strip().splitlines()[-4:])})"
        )
    return {"installed": spec}


def apply_nccl(staged: str, nccl: dict) -> str:
    """The base's system NCCL at its own path, and the donor's pip NCCL pointed at it."""
    if nccl.get("mode") != "system":
        return nccl.get("summary", "nothing to carry")
    chain = nccl["chain"]
    for step in reversed(chain):
        source = os.path.join(staged, "nccl", step["path"].lstrip("/"))
        os.makedirs(os.path.dirname(step["path"]), exist_ok=True)
        if os.path.lexists(step["path"]):
            os.remove(step["path"])
        if "link" in step:
            os.symlink(step["link"], step["path"])
        else:
            shutil.copy2(source, step["path"])
    system = chain[0]["path"]
    pip_lib = pip_nccl()
    if pip_lib is None:
        return f"system NCCL {system} placed; the donor has no pip NCCL to point at it"
    os.replace(pip_lib, pip_lib + ".pip")
    os.symlink(system, pip_lib)
    return f"system NCCL {system} placed; the donor's {pip_lib} now links to it (the wheel's kept as .pip)"


def apply(staged: str, ray_from: str, pip_args: str, report_path: str) -> dict:
    with open(os.path.join(staged, "facts.json"), encoding="utf-8") as handle:
        base = json.load(handle)
    head = python_facts()
    if importlib.util.find_spec("vllm") is None:
        raise Refused(f"the donor's {sys.executable} has no `vllm`: graft builds on the donor's vLLM")
    have = installed("ray")
    report = {"ray": base["ray"], "extras": base["extras"], "base": _abi(base), "donor": _abi(head)}
    if have is not None and have.version == base["ray"]:
        report.update(way="present", why=f"the donor already has Ray {have.version}")
    elif have is not None:
        raise Refused(
            f"the donor already has Ray {have.version}, the base runs Ray {base['ray']}: one Ray release "
            "must run everywhere; pick a donor without Ray or with the base's"
        )
    else:
        way, why = abi_decision(base, head)
        if ray_from != "auto" and ray_from != way:
            if ray_from == "copy":
                raise Refused(f"RAY_FROM=copy, but {why}: the base's compiled Ray cannot load in the donor")
            why = f"RAY_FROM={ray_from} (an ABI match would allow a copy: {why})"
        way = way if ray_from == "auto" else ray_from
        report.update(way=way, why=why)
        report.update(copy_ray(staged, base, head) if way == "copy" else install_ray(base, pip_args, why))
    report["nccl"] = apply_nccl(staged, base.get("nccl", {}))
    with open(report_path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
    say(f"Ray {base['ray']}: {report['way']} ({report['why']})")
    say(f"NCCL: {report['nccl']}")
    return report


def _abi(facts: dict) -> str:
    return " ".join(str(facts.get(key)) for key in ("cache_tag", "soabi", "machine", "libc", "glibc"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    out = commands.add_parser("export")
    out.add_argument("--out", required=True)
    into = commands.add_parser("apply")
    into.add_argument("--staged", required=True)
    into.add_argument("--ray-from", choices=("auto", "copy", "install"), default="auto")
    into.add_argument("--pip-args", default="")
    into.add_argument("--report", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            export(args.out)
        else:
            apply(args.staged, args.ray_from, args.pip_args, args.report)
    except Refused as exc:
        print(f"graft refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
