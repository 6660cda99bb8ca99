"""docs/architecture.md keeps up with the code: a paragraph for every folder of the
package, a row for every module at its top, and the layer picture the contract checks."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "boundedcode_gateway"
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def _folders() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__"))


def _section(title: str) -> str:
    """The text under a ``## title`` heading, up to the next one."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, re.M | re.S)
    assert match is not None, f"docs/architecture.md has no '## {title}' section"
    return match.group(1)


def test_every_folder_has_its_paragraph() -> None:
    section = _section("Folders")
    headed = set(re.findall(r"^### `([a-z_]+)/`$", section, re.M))
    missing = [name for name in _folders() if name not in headed]
    assert not missing, f"folders without a paragraph in docs/architecture.md: {missing}"
    gone = sorted(headed - set(_folders()))
    assert not gone, f"docs/architecture.md describes folders that are gone: {gone}"
    for name in _folders():
        paragraph = section.split(f"### `{name}/`", 1)[1].split("\n### ", 1)[0]
        assert "Must not" in paragraph, f"the paragraph of {name}/ says nothing it must not do"


def test_every_top_level_module_has_its_row() -> None:
    section = _section("Modules at the top")
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    missing = [name for name in modules if f"`{name}`" not in section]
    assert not missing, f"modules without a row in docs/architecture.md: {missing}"


def test_the_layer_picture_is_the_contract() -> None:
    block = re.search(r"```\n(.*?)```", _section("Layers"), re.S)
    assert block is not None
    drawn = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    assert drawn == layers
