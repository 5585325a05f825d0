"""`memstream init`: a persona file from flags (--yes) or from answers on stdin, checked against the fake server."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from memstream.cli import main
from memstream.config import load_persona
from tests.fakes.openai_server import FakeOpenAIServer


@pytest.fixture
async def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAIServer]:
    monkeypatch.chdir(tmp_path)
    for name in ("MEMSTREAM_DATA_DIR", "OPENAI_BASE_URL", "OPENAI_API_KEY", "DISCORD_TOKEN", "MEMSTREAM_PERSONA"):
        monkeypatch.delenv(name, raising=False)
    async with FakeOpenAIServer() as running:
        yield running


async def init(capsys: pytest.CaptureFixture[str], *argv: str, stdin: str | None = None,
               monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, str, str]:
    """Run `memstream init` in a thread (the fake serves on this loop): exit status, stdout, stderr."""
    if stdin is not None:
        assert monkeypatch is not None
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["init", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def read(name: str) -> str:
    """A file's text (in the test's folder)."""
    return Path(name).read_text(encoding="utf-8")


def exists(name: str) -> bool:
    """Whether a file or folder exists (in the test's folder)."""
    return Path(name).exists()


def flags(server: FakeOpenAIServer, out: str = "personas/ada.toml") -> list[str]:
    return ["--name", "Ada", "--summary", "Ada keeps the lighthouse.", "--base-url", server.base_url,
            "--agent-model", "gpt-fake", "--embedding-model", "text-embedding-fake", "--guild", "123456789012345678",
            "--guild", "42", "--out", out, "--yes"]


async def test_from_flags_then_doctor(server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = await init(capsys, *flags(server))
    assert code == 0 and "warning" not in err
    persona = load_persona("personas/ada.toml")
    assert (persona.name, persona.summary) == ("Ada", "Ada keeps the lighthouse.")
    assert persona.models.base_url == server.base_url
    assert (persona.models.agent, persona.models.rater, persona.models.reflector) == ("gpt-fake",) * 3
    assert persona.models.embedding == "text-embedding-fake"
    assert persona.memory.profile == "hybrid" and persona.discord.guilds == (123456789012345678, 42)
    assert persona.database.is_absolute() and persona.database.parts[-2:] == ("personas", "ada.db")
    assert "memstream doctor --persona personas/ada.toml" in out
    assert "memstream chat --persona personas/ada.toml" in out
    assert any(r.path == "/v1/models" for r in server.requests)  # the server was asked
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["doctor", "--persona", "personas/ada.toml"]) == 0
    assert "skipped: set DISCORD_TOKEN" in capsys.readouterr().out


async def test_json_output(server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await init(capsys, *flags(server), "--json")
    data = json.loads(out)
    assert code == 0 and data["file"] == "personas/ada.toml" and data["warnings"] == []
    assert "memstream chat --persona personas/ada.toml" in data["next"]


async def test_refuses_to_overwrite_without_force(server: FakeOpenAIServer,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = await init(capsys, "--name", "Other", "--out", "personas/ada.toml", "--yes")
    assert code == 0
    code, _, err = await init(capsys, *flags(server))
    assert code == 2 and "exists" in err and "--force" in err
    assert load_persona("personas/ada.toml").name == "Other"  # unchanged
    code, _, _ = await init(capsys, *flags(server), "--force")
    assert code == 0 and load_persona("personas/ada.toml").name == "Ada"


async def test_unreachable_server_still_writes_with_a_warning(server: FakeOpenAIServer,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    argv = flags(server)
    await server.stop()
    code, _, err = await init(capsys, *argv)
    assert code == 0 and load_persona("personas/ada.toml").name == "Ada"
    assert "warning: the model server did not answer: cannot reach" in err


async def test_model_the_server_lacks_is_a_warning(server: FakeOpenAIServer,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*flags(server), "--rater-model", "tiny-rater"]
    code, _, err = await init(capsys, *argv)
    assert code == 0 and "does not list tiny-rater (Ollama: ollama pull tiny-rater)" in err
    assert load_persona("personas/ada.toml").models.rater == "tiny-rater"


async def test_never_writes_a_secret(server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-key-1234")
    monkeypatch.setenv("DISCORD_TOKEN", "discord-secret-token")
    code, _, _ = await init(capsys, *flags(server), "--api-key-env", "OPENAI_API_KEY")
    text = read("personas/ada.toml")
    assert code == 0 and "sk-secret" not in text and "discord-secret" not in text
    assert 'api_key_env = "OPENAI_API_KEY"' in text and 'token_env = "DISCORD_TOKEN"' in text
    # A key given where the variable's name belongs is refused, and nothing is written.
    code, _, err = await init(capsys, *flags(server, "personas/b.toml"), "--api-key-env", "sk-proj-abc123")
    assert code == 2 and "never the secret itself" in err and not exists("personas/b.toml")


async def test_openai_without_a_key(server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await init(capsys, "--name", "Ada", "--yes")
    text = read("personas/ada.toml")
    assert code == 0 and "OPENAI_API_KEY is not set" in err
    persona = load_persona("personas/ada.toml", environ={})
    assert persona.models.base_url is None and persona.models.agent == "gpt-4o-mini"
    assert "# base_url" in text and persona.summary.startswith("Ada is")


async def test_yes_needs_a_name(server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = await init(capsys, "--yes")
    assert code == 2 and "--name is required with --yes" in err and not exists("personas")


async def test_bad_flag_values_are_one_line_errors(server: FakeOpenAIServer,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for bad, needle in ((["--timezone", "Mars/Base"], "IANA time zone"), (["--guild", "general"], "server ids"),
                        (["--base-url", "localhost:11434"], "neither openai nor a URL"),
                        (["--base-url", "http://user:pw@host/v1"], "credentials in the URL")):
        code, _, err = await init(capsys, "--name", "Ada", "--out", "x.toml", "--yes", *bad)
        assert code == 2 and needle in err and "Traceback" not in err and "pw" not in err, (bad, err)
        assert not exists("x.toml")


async def test_text_that_needs_escaping_round_trips(server: FakeOpenAIServer,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    summary = 'She says "hi" \\o/ and\nthen [discord] token = "x"\x7f with a tab\t'
    code, _, _ = await init(capsys, *flags(server), "--summary", summary, "--name", 'Ada "The" Countess')
    persona = load_persona("personas/ada.toml")
    assert code == 0 and persona.summary == summary.strip() and persona.name == 'Ada "The" Countess'
    assert persona.discord.token_env == "DISCORD_TOKEN"


# -- interactive ---------------------------------------------------------------------------------------------


async def test_interactive_answers_from_stdin(server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    answers = ["Ada Lovelace", "", "Mars/Base", "Europe/London", server.base_url, "", "", "123, 456", ""]
    code, out, err = await init(capsys, stdin="\n".join(answers) + "\n", monkeypatch=monkeypatch)
    assert code == 0, err
    assert "Persona's name: " in err and "Time zone [UTC]: " in err
    assert "'Mars/Base' is not an IANA time zone" in err  # asked again
    assert "it lists: gpt-fake, text-embedding-fake" in err
    # Defaults in brackets, taken from what the server lists when the usual ones are not there.
    assert "Chat model [gpt-fake]: " in err and "Embedding model [text-embedding-fake]: " in err
    assert "Write the persona file to [personas/ada-lovelace.toml]: " in err
    persona = load_persona("personas/ada-lovelace.toml")
    assert persona.timezone == "Europe/London" and persona.discord.guilds == (123, 456)
    assert persona.summary.startswith("Ada Lovelace is a friendly")
    assert persona.models.agent == "gpt-fake" and persona.models.embedding == "text-embedding-fake"
    assert "memstream chat --persona personas/ada-lovelace.toml" in out


async def test_interactive_flags_answer_their_questions(server: FakeOpenAIServer,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = await init(capsys, "--name", "Ada", "--base-url", server.base_url, "--out", "ada.toml",
                              stdin="Keeps the light.\n\nllama3.1\nnomic\n\n", monkeypatch=monkeypatch)
    assert code == 0, err
    assert "Persona's name" not in err and "Model server" not in err and "Write the persona" not in err
    persona = load_persona("ada.toml")
    assert persona.summary == "Keeps the light." and persona.models.agent == "llama3.1"


async def test_input_that_ends_early(server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = await init(capsys, stdin="Ada\n", monkeypatch=monkeypatch)
    assert code == 2 and "(input ended): give it as --summary" in err
    assert not exists("personas")
