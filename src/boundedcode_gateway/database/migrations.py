"""Numbered SQL files packaged with the code, read in order: each store's schema steps."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files

_MIGRATION_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered SQL file of a ``migrations/`` folder."""

    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        """The file's statements, split on ``;`` (migrations keep ``;`` out of literals)."""
        lines = [ln for ln in self.sql.splitlines() if not ln.strip().startswith("--")]
        return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def load_migrations(directory: str, package: str) -> list[Migration]:
    """All packaged migrations of folder ``directory`` of ``package``, in numeric order;
    two files with one number is an error."""
    folder = files(package).joinpath(directory)
    found: dict[int, Migration] = {}
    for entry in folder.iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match is None:
            continue
        version = int(match.group(1))
        if version in found:
            raise RuntimeError(f"two migrations numbered {version:04d}: {entry.name}")
        found[version] = Migration(version, match.group(2), entry.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]
