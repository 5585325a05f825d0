"""`memstream --help` answers at once: parsing loads no numpy, numba, openai SDK, torch, SQLite, aiohttp or
discord.py (the plugins' commands are listed without loading what they run).

What is loaded is checked, not how long it takes (timings belong in bench/): a fresh interpreter parses the
arguments and lists the heavy modules it imported.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numpy", "numba", "openai", "torch", "sentence_transformers", "xllamacpp", "aiosqlite", "sqlite_vec",
         "sqlite3", "pysqlite3", "aiohttp", "httpx", "discord")


def _loaded(*argv: str, first: str = "") -> list[str]:
    """The heavy modules a fresh interpreter has loaded after `memstream ARGV` parsed its arguments."""
    script = (f"import json, sys\n{first}\nfrom memstream.cli import main\n"
              "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
              f"print(json.dumps(sorted({{name.split('.')[0] for name in sys.modules}} & {set(HEAVY)!r})))")
    done = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=60)
    found: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("argv", [["--help"], ["chat", "--help"], ["recall", "--help"], ["--version"],
                                  ["observe"], ["nonsense"], ["bot", "--help"], ["web", "--help"],
                                  ["doctor", "--help"]])
def test_help_and_usage_errors_load_no_heavy_module(argv: list[str]) -> None:
    assert _loaded(*argv) == []


def test_the_probe_sees_a_heavy_module_when_one_is_loaded() -> None:
    # The probe itself can fail: the stream (numpy, the SDK, SQLite) loaded first shows up in its answer.
    assert {"numpy", "openai"} <= set(_loaded("--help", first="import memstream.stream"))


def test_the_public_names_still_load_on_first_use() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys, memstream; assert 'numpy' not in sys.modules; "
                           "from memstream import MemoryStream, Store; import memstream.stream as s; "
                           "assert MemoryStream is s.MemoryStream and 'Store' in dir(memstream)"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
