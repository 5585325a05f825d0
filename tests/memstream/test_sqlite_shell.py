"""The README's example of sqlite-vec's SQL functions over a persona's file runs as written: its SQL through the
store's own binding, and the whole command in the sqlite3 shell where this machine has one."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlite_vec

from memstream import MemoryStream
from memstream.store import sqlite_module

README = Path(__file__).resolve().parents[2] / "README.md"
STREAM = "guild:1"
TEXTS = ("Isabella is planning a Valentine's Day party", "Maria is bringing Klaus to the party",
         "Klaus is writing a paper on gentrification")
OTHER = "Someone in another server talks about the party"


def example() -> str:
    """The README's bash block that calls vec_distance_cosine."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    [block] = [b for b in blocks if "vec_distance_cosine" in b]
    return str(block)


def example_sql() -> str:
    """The SQL the example gives the shell (its last, double-quoted argument)."""
    match = re.search(r'"\n(SELECT .*?;)"', example(), re.S)
    assert match, "the README's example no longer ends with its SQL in double quotes"
    return match.group(1)


@pytest.fixture
async def persona_file(memory: MemoryStream, database: Path | str) -> Path:
    """A store file with three memories in one stream and one in another, as the store writes them."""
    assert isinstance(database, Path)
    for text in TEXTS:
        await memory.observe(text, stream=STREAM, importance=5)
    await memory.observe(OTHER, stream="guild:2", importance=5)
    return database


def check(rows: list[tuple[object, ...]]) -> None:
    """Memory 1 first at distance 0, then its stream's others by distance; never another stream's."""
    ids, distances, texts = ([int(str(row[0])) for row in rows], [float(str(row[1])) for row in rows],
                             [str(row[2]) for row in rows])
    assert ids[:1] == [1] and distances[0] == 0.0 and texts[0] == TEXTS[0]
    assert sorted(ids) == [1, 2, 3] and OTHER not in texts
    assert distances == sorted(distances) and all(0 <= d <= 2 for d in distances)


@pytest.mark.sqlite_only
async def test_readme_sql_runs_against_a_store_file(persona_file: Path) -> None:
    conn = sqlite_module().connect(f"file:{persona_file}?mode=ro", uri=True)
    try:
        conn.enable_load_extension(True)
        conn.load_extension(sqlite_vec.loadable_path())
        check(conn.execute(example_sql()).fetchall())
    finally:
        conn.close()


@pytest.mark.sqlite_only
@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="no sqlite3 shell on this machine")
def test_readme_command_runs_in_the_sqlite3_shell(persona_file: Path) -> None:
    probe = subprocess.run(["sqlite3", ":memory:", f".load {sqlite_vec.loadable_path()}", "SELECT vec_version();"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode or not probe.stdout.startswith("v"):
        pytest.skip(f"this sqlite3 shell cannot load extensions: {probe.stderr.strip()}")
    command = (example().replace("python -c", f"'{sys.executable}' -c")
               .replace("data/isabella.db", f"'{persona_file}'").replace("-box", "-tabs"))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    check([tuple(line.split("\t")) for line in done.stdout.splitlines()])
