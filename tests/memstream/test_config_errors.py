"""Every key of a persona file, given a bad value, is refused with a message that names the file, the key and what
is allowed; a refused persona starts nothing (no database file, no connection). Bad command-line input is a
short usage error, never a traceback."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from memstream import ConfigError, DiscordConfig, ModelConfig, StreamConfig, load_persona
from memstream.cli import main

MINIMAL = '[persona]\nname = "Maria Lopez"\nsummary = "A physics student."\n'
# A wrong type for every key, and where a range applies, a value just outside it.
WRONG_TYPE: dict[type, list[object]] = {str: [3, ""], float: ['"soon"', "true"], int: ["2.5", '"5"'],
                                        bool: ['"yes"', "1"], tuple: ['"123"', '["general"]']}
OUT_OF_RANGE = {
    ("memory", "weight_recency"): "-1.0", ("memory", "weight_importance"): "-0.5", ("memory", "weight_relevance"): "-2",
    ("memory", "decay"): "0.0", ("memory", "k"): "0", ("memory", "reflection_threshold"): "0",
    ("memory", "recent_for_questions"): "0", ("memory", "min_citations"): "0", ("memory", "max_concurrency"): "0",
    ("memory", "embed_batch_size"): "0", ("memory", "screen_mb"): "-1", ("memory", "resident_mb"): "-1",
    ("models", "timeout"): "-1",
    ("models", "max_retries"): "-1",
    ("models", "embedding_dimensions"): "0", ("models", "base_url"): '"ftp://models.example"',
    ("discord", "history"): "51", ("discord", "reflect_check_minutes"): "0", ("persona", "timezone"): '"Mars/Base"',
}


def _type_of(cls: type, name: str) -> type:
    default = getattr(cls(), name)
    for kind in (bool, int, float, str, tuple):
        if isinstance(default, kind):
            return kind
    return int if "dimensions" in name else str  # None defaults: embedding_dimensions, base_url


def _cases() -> list[tuple[str, str, str]]:
    cases = []
    tables = {"memory": StreamConfig, "models": ModelConfig, "discord": DiscordConfig}
    for table, cls in tables.items():
        for f in fields(cls):
            for value in WRONG_TYPE[_type_of(cls, f.name)]:
                if (table, f.name) == ("models", "base_url") and value == "":
                    continue  # an empty base_url means "unset"
                cases.append((table, f.name, str(value) if not isinstance(value, str) or value else '""'))
    for key in ("name", "summary", "timezone", "database"):
        cases += [("persona", key, "3"), ("persona", key, "[]")]
    cases += [(table, key, value) for (table, key), value in OUT_OF_RANGE.items()]
    return cases


def _persona_text(table: str, key: str, value: str) -> str:
    if table == "persona":
        base = {"name": '"Maria Lopez"', "summary": '"A physics student."', key: value}
        return "[persona]\n" + "".join(f"{k} = {v}\n" for k, v in base.items())
    return MINIMAL + f"[{table}]\n{key} = {value}\n"


@pytest.mark.parametrize(("table", "key", "value"), _cases())
def test_every_bad_value_names_the_file_the_key_and_what_is_allowed(tmp_path: Path, table: str, key: str,
                                                                     value: str) -> None:
    path = tmp_path / "maria.toml"
    path.write_text(_persona_text(table, key, value), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_persona(path, environ={})
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert f"[{table}] {key}" in message
    assert "must" in message or "known" in message, message
    assert "\n" not in message


@pytest.mark.parametrize("command", ["observe", "stats", "bot", "forget"])
def test_a_refused_persona_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str], command: str) -> None:
    monkeypatch.setenv("DISCORD_TOKEN", "token")
    db = tmp_path / "never.db"
    path = tmp_path / "maria.toml"
    path.write_text(MINIMAL.replace("[persona]\n", f'[persona]\ndatabase = "{db}"\n')
                    + '[models]\nbase_url = "http://127.0.0.1:9/v1"\n[memory]\nk = 0\n', encoding="utf-8")
    argv = {"observe": ["observe", "hello"], "stats": ["stats"], "bot": ["bot"], "forget": ["forget", "1"]}[command]
    assert main([*argv, "--persona", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"memstream: error: {path}: [memory] k must be a whole number >= 1, got 0"
    assert not db.exists() and not db.parent.joinpath("never.db-wal").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["recall", "x", "-k", "0"], "must be a whole number >= 1"),
    (["recall", "x", "-k", "many"], "argument -k/--k: must be a whole number >= 1, got 'many'"),
    (["recall", "x", "--stream", " "], "must be a non-empty key"),
    (["observe", "x", "--importance", "11"], "must be a whole number from 1 to 10"),
    (["observe", "x", "--at", "next tuesday"], "not an ISO-8601 time"),
    (["why", "seven"], "argument memory_id: must be a memory id, a whole number from 1 to 9223372036854775807"),
])
def test_bad_command_line_input_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--persona", str(tmp_path / "unused.toml")])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(("argv", "message"), [
    (["forget"], "say what to forget"),
    (["forget", "--all"], "--all forgets one whole stream: give it with --stream KEY"),
    (["forget", "3", "--author", "42"], "say what to forget"),
])
def test_forget_says_what_it_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                   message: str) -> None:
    path = tmp_path / "maria.toml"
    path.write_text(MINIMAL.replace("[persona]\n", f'[persona]\ndatabase = "{tmp_path / "m.db"}"\n'),
                    encoding="utf-8")
    assert main([*argv, "--persona", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "m.db").exists()


@pytest.mark.parametrize("url", ["http://bob:hunter2@localhost:11434/v1", "https://bob@api.example.com/v1"])
def test_a_base_url_with_credentials_is_refused_saying_what_to_do(tmp_path: Path, url: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f'[persona]\nname = "Maria"\nsummary = "A student."\n[models]\nbase_url = "{url}"\n',
                    encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_persona(path, environ={})
    message = str(info.value)
    assert message.startswith(f"{path}: [models] base_url: credentials in the URL")
    assert "OPENAI_API_KEY" in message and "hunter2" not in message and "\n" not in message


def test_an_openai_base_url_variable_with_credentials_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[persona]\nname = "Maria"\nsummary = "A student."\n', encoding="utf-8")
    persona = load_persona(path, environ={})
    with pytest.raises(ConfigError, match="credentials in the URL") as info:
        persona.models.api_key({"OPENAI_BASE_URL": "http://bob:hunter2@localhost:8080/v1"})
    assert "hunter2" not in str(info.value)


def test_every_problem_of_a_persona_file_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[persona]\nname = "M"\nsummary = "S"\ntimezone = "Mars/Olympus"\ncolour = "teal"\n'
                    '[models]\ntimeout = "soon"\n[memory]\nk = "five"\nweight_recency = nan\n'
                    '[discord]\nhistory = true\n[extras]\n', encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_persona(path, environ={})
    lines = str(info.value).splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines)
    for part in ("[persona] timezone", "[persona] unknown key(s) colour", "[models] timeout", "[memory] k:",
                 "[memory] weight_recency", "[discord] history", "unknown table(s) extras"):
        assert any(part in line for line in lines), part
