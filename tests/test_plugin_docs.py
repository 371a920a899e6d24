"""
Each built-in plugin has its page, C{docs/plugins/<name>.md}, and the page's
settings table says the settings the code reads, with the code's defaults.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
from twisted.trial.unittest import SynchronousTestCase

from rpmiddleware.builtin import DEFAULT_CHAIN, FACTORIES

TOP = Path(__file__).resolve().parent.parent
PAGES = TOP / "docs" / "plugins"

#: A settings table's row: | `name` | `default` | ...
ROW = re.compile(r"^\| `(?P<name>[a-z_]+)` \| (?P<default>[^|]+?) \|", re.MULTILINE)


def written(value: Any) -> str:
    """A default as the pages write it (TOML's spelling, in backquotes)."""
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if value is None:
        return "none"
    return f"`{value!r}`"


def defaultOf(field: msgspec.structs.FieldInfo) -> Any:
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    return field.default


def settingsSection(text: str) -> str:
    """The page from its settings heading to the next heading of its level."""
    match = re.search(r"^## Settings.*?(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    return match[0] if match else ""


def page(name: str) -> str:
    return (PAGES / f"{name}.md").read_text(encoding="utf-8")


class PluginPagesTests(SynchronousTestCase):
    def test_everyPluginHasItsPage(self) -> None:
        names = [factory.name for factory in FACTORIES]
        self.assertIn("scene", names)
        missing = [name for name in names if not (PAGES / f"{name}.md").is_file()]
        self.assertEqual(missing, [], "write docs/plugins/<name>.md for each")

    def test_settingsTablesMatchTheCode(self) -> None:
        """
        Every setting of a plugin with a settings class is in its page's
        table, with its default; the table names no other.  (A page with a
        TOML example instead of a table names each setting.)
        """
        checked = 0
        for factory in FACTORIES:
            settings = getattr(factory, "settings", None)
            if settings is None:
                continue
            fields = msgspec.structs.fields(settings)
            rows = {
                m["name"]: m["default"].strip()
                for m in ROW.finditer(settingsSection(page(factory.name)))
            }
            if not fields:
                continue
            checked += 1
            if not set(rows) & {f.name for f in fields}:
                # A page that shows its settings as a TOML example, not a
                # table: each is named there at least.
                text = page(factory.name)
                unnamed = [f.name for f in fields if f"{f.name} = " not in text]
                self.assertEqual(unnamed, [], f"docs/plugins/{factory.name}.md")
                continue
            expected = {f.name: written(defaultOf(f)) for f in fields}
            documented = {name: rows.get(name) for name in expected}
            self.assertEqual(documented, expected, f"docs/plugins/{factory.name}.md")
            self.assertEqual(
                sorted(set(rows) - set(expected)), [], f"docs/plugins/{factory.name}.md"
            )
        self.assertGreaterEqual(checked, 6)

    def test_readmeChain(self) -> None:
        """
        The README's default chain is DEFAULT_CHAIN.
        """
        readme = (TOP / "README.md").read_text(encoding="utf-8")
        match = re.search(r"# The default chain is (.*?);", readme, re.DOTALL)
        assert match is not None
        said = dict(
            (name, int(priority)) for name, priority in re.findall(r"([a-z-]+) = (\d+)", match[1])
        )
        self.assertEqual(said, DEFAULT_CHAIN)
