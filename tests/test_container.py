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
