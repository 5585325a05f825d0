"""The wheel carries the prompts and migrations: an installed memstream works without the source tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_ships_prompts_and_migrations_and_finds_them(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("memstream-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        plugins = archive.read(entry_points).decode()
        archive.extractall(site)
    # `memstream bot` is the bot's plugin: without its entry point an installed memstream has no bot command
    assert "[memstream.commands]\nbot = bot.plugin:register" in plugins
    for prompt in ROOT.glob("prompts/*.md"):
        assert f"memstream/prompt_templates/{prompt.name}" in names
    for migration in ROOT.glob("migrations/*.sql"):
        assert f"memstream/migrations/{migration.name}" in names
    for migration in ROOT.glob("migrations/postgres/*.sql"):
        assert f"memstream/migrations/postgres/{migration.name}" in names
    # workers run _load.py by path
    assert {"bot/__main__.py", "bot/plugin.py", "memstream/py.typed", "memstream/store/_load.py"} <= names
    for static in ROOT.glob("memstream/web/static/*"):  # the dashboard's script, stylesheet and icon
        assert f"memstream/web/static/{static.name}" in names
    script = (
        "import asyncio, memstream.prompts as p, memstream.store as s\n"
        "print(p.__file__)\n"
        "from memstream.store.migrations import migration_dir\n"
        "assert (migration_dir('postgres') / '0001_initial.sql').is_file(), migration_dir('postgres')\n"
        "assert all(p.load_prompt(n).template for n in p.PROMPT_NAMES)\n"
        "async def main():\n"
        "    store = await s.Store.open('x.db')\n"
        "    print(await store.applied())\n"
        "    await store.close()\n"
        "asyncio.run(main())\n"
    )
    result = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n{script}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    where, applied = result.stdout.strip().splitlines()
    assert Path(where).is_relative_to(site)  # the wheel's copy, not the source tree
    assert applied == str(sorted(int(m.name[:4]) for m in ROOT.glob("migrations/*.sql")))
