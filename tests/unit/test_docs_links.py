"""The README stays short, every relative link in it and in docs/ lands, every config key is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from components.config import NodeConfig, RayPorts, StackConfig

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# Written on other branches of this round; the README links them, so they must exist once merged.
EXPECTED = ("docs/fabric.md", "docs/health.md")
# Their keys are documented on their own pages, not in configuration.md.
OWN_PAGES = {"fabric": "fabric.md", "health": "health.md", "bench": "bench.md", "answers": "answers.md"}
MAX_README_LINES = 300

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, …


def outside_fences(text: str) -> list[str]:
    """The lines of a Markdown text that are not inside a ``` fence."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2 … for repeated headings."""
    seen: dict[str, int] = {}
    found = set()
    for line in outside_fences(path.read_text()):
        match = re.match(r"^#{1,6} (.+)$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    """The relative link targets of a page (code fences and inline code left out)."""
    found = []
    for line in outside_fences(path.read_text()):
        found += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return [target for target in found if not EXTERNAL.match(target)]


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with a page's relative links: a file that is not there, an anchor with no heading."""
    problems = []
    for target in links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        rel = dest.relative_to(root).as_posix() if dest.is_relative_to(root) else str(dest)
        if rel in EXPECTED and not dest.exists():
            continue  # test_the_pages_other_branches_write_exist says so, once
        if not dest.exists():
            problems.append(f"{target}: no file {rel}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {rel}")
    return problems


def test_the_readme_is_a_few_hundred_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move reference text into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert broken(page) == []


@pytest.mark.parametrize("expected", EXPECTED)
def test_the_pages_other_branches_write_exist(expected):
    assert expected in links(README), f"the README does not link {expected}"
    assert (ROOT / expected).is_file(), f"{expected} is linked from the README but missing"


def test_the_readme_indexes_every_page_of_docs():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(README)}
    unlisted = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlisted == [], f"docs/ pages the README's index does not link: {unlisted}"


def test_the_checker_sees_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title `x.y`\n\n## Same\n\n## Same\n\n```\n# not a heading\n```\n")
    assert anchors(tmp_path / "a.md") == {"title-xy", "same", "same-1"}
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#same-1) [gone](c.md) [bad](a.md#nothing) `[code](x.md)` [web](https://x) [self](#gone)\n"
    )
    assert links(page) == ["a.md#same-1", "c.md", "a.md#nothing", "#gone"]
    assert broken(page, tmp_path.resolve()) == [
        "c.md: no file c.md",
        "a.md#nothing: no heading #nothing in a.md",
        "#gone: no heading #gone in b.md",
    ]


def section(text: str, key: str) -> str:
    """The part of configuration.md under the heading that names `qwen35-spark:<key>`."""
    match = re.search(rf"^## [^\n]*`qwen35-spark:{key}`[^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/configuration.md has no section for qwen35-spark:{key}"
    return match.group(1)


def keys(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


@pytest.mark.parametrize("key", keys(StackConfig))
def test_every_config_key_is_in_the_configuration_reference(key):
    text = (ROOT / "docs/configuration.md").read_text()
    body = section(text, key)
    if key in OWN_PAGES:
        assert f"]({OWN_PAGES[key]})" in body, f"qwen35-spark:{key} does not point at {OWN_PAGES[key]}"
        return
    field = StackConfig.model_fields["copy_" if key == "copy" else key]
    model = field.annotation
    if key == "nodes":
        model = NodeConfig
    fields = keys(model) + (keys(RayPorts) if model is NodeConfig else [])
    missing = [f for f in fields if not re.search(rf"`(?:{key}\.)?{f}`", body)]
    assert missing == [], f"qwen35-spark:{key} keys missing from docs/configuration.md: {missing}"


def resource_names() -> list[str]:
    """Every dynamic resource's type name (`qwen35:<Name>`), from the packages on disk."""
    found = []
    for path in sorted((ROOT / "components").glob("*/resource.py")):
        found += re.findall(r'module="qwen35", name="(\w+)"', path.read_text())
    return found


def fence_after(text: str, heading: str) -> str:
    """The first ``` block under a README heading."""
    match = re.search(rf"^## {re.escape(heading)}\n.*?^```\n(.*?)^```", text, re.M | re.S)
    assert match, f"README.md has no code block under '## {heading}'"
    return match.group(1)


def test_the_resources_come_from_the_packages():
    # The lists below are derived, so a test that read none would pass on anything.
    assert {"NodeProof", "FabricCheck", "ServeBench", "ReadinessGate"} <= set(resource_names())


@pytest.mark.parametrize("name", resource_names())
def test_the_readme_s_tree_names_every_resource(name):
    tree = fence_after(README.read_text(), "What a stack deploys")
    assert f"dynamic/qwen35:{name} " in tree, f"the README's tree of resources omits {name}"


@pytest.mark.parametrize(
    "package", sorted(p.parent.name for p in (ROOT / "components").glob("*/resource.py"))
)
def test_the_readme_s_layout_names_every_resource_package(package):
    layout = fence_after(README.read_text(), "Layout")
    assert f"{package}/" in layout, f"the README's layout omits components/{package}/"


@pytest.mark.parametrize(
    "name", [n for n in resource_names() if n.endswith(("Check", "Proof", "Gate", "Bench"))]
)
def test_the_readme_s_table_of_checks_names_every_check(name):
    text = README.read_text()
    start = text.index("| step | what the program checks |")
    checks = text[start:].partition("\n\n")[0]
    assert f"`{name}`" in checks, f"the README's table of checks omits {name}"
