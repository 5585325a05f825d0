"""The command line's place in the import graph: the dashboard never imports it (what both show is in
memstream.render), the core never imports the bot (it is a plugin), and no module of ours is loaded by name."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import memstream

ROOT = Path(memstream.__file__).resolve().parent


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def _named(path: Path) -> list[str]:
    """The names a file calls import_module or __import__ with."""
    return [ast.unparse(node) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("import_module", "__import__"))]


def test_the_dashboard_never_imports_the_command_line() -> None:
    for path in (ROOT / "web").rglob("*.py"):
        assert not {m for m in _imports(path) if m.startswith("memstream.cli")}, path


def test_the_core_never_imports_the_bot() -> None:
    for path in ROOT.rglob("*.py"):
        assert not {m for m in _imports(path) if m == "bot" or m.startswith("bot.")}, path


def test_the_command_line_loads_no_module_by_name() -> None:
    for path in [*(ROOT / "cli").rglob("*.py"), ROOT / "render.py"]:
        assert _named(path) == [], path


def test_render_is_light_at_import() -> None:
    script = ("import json, sys, memstream.render\n"
              "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules} & {'numpy', 'openai', 'sqlite3', "
              "'aiosqlite', 'aiohttp', 'discord'})))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout) == [], done.stderr
