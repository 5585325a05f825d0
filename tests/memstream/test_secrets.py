"""A PostgreSQL password never leaves memstream: planted in each of libpq's forms (user:password@, ?password=,
percent-encoded, a multi-host URL, ?options= and ?sslpassword=), it is in none of doctor's lines (text and
--json), `stats --json`, the error of a connection that fails, the log, the dashboard's pages. Issue 30, cases
1, 2, 14 and 16: one masking (memstream.config.redact) for every output."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from aiohttp.test_utils import TestClient, TestServer

from memstream.cli import main
from memstream.config import redact, url_problem
from memstream.errors import ConfigError, StoreError
from memstream.models.roles import RoleModel
from memstream.store import Store
from memstream.stream import MemoryStream
from memstream.testing import FakeEmbedder, ScriptedChat
from memstream.web import WebOptions, make_app

SECRET = "Hunter2Secret"
ENCODED = "".join(f"%{b:02X}" for b in SECRET.encode())  # the same password, every character percent-encoded
# Where nothing listens: every connection is refused at once.
REFUSED = [
    f"postgresql://bot:{SECRET}@127.0.0.1:1/x",
    f"postgresql://bot@127.0.0.1:1/x?password={SECRET}",
    f"postgresql://bot:{ENCODED}@127.0.0.1:1/x",
    f"postgresql://bot@127.0.0.1:1/x?pass%77ord={ENCODED}",
    f"postgresql://bot:{SECRET}@127.0.0.1:1,127.0.0.1:2/x",
    f"postgresql://bot@127.0.0.1:1/x?options=-c%20application_name%3D{SECRET}&sslpassword={SECRET}",
    f"postgresql://bot:{SECRET}%3F@127.0.0.1:1/x?sslmode=disable&passfile=/nowhere/pgpass",
]
# libpq would read these otherwise than they are shown, and its messages would quote pieces of the password.
AMBIGUOUS = [
    f"postgresql://bot:{SECRET[:6]}@{SECRET[6:]}@127.0.0.1:1/x",
    f"postgresql://bot:{SECRET[:6]}/{SECRET[6:]}@127.0.0.1:1/x",
    f"postgresql://bot@127.0.0.1:1/x?password={SECRET[:6]}&{SECRET[6:]}",
]


def clean(text: str) -> None:
    """No piece of the password, as given or encoded, is in `text`."""
    for piece in (SECRET, ENCODED, SECRET[:6], SECRET[6:], ENCODED[:18], ENCODED[18:]):
        assert piece not in text, text


def planted(url: str) -> list[str]:
    """The test database's URL (a server that trusts its local users) with a password in each form."""
    parts = urlsplit(url)
    if parts.password:
        pytest.skip("the test server's URL carries a password of its own")
    user, name, query = parts.username or "postgres", parts.path, parts.query
    hosts = parse_qs(query).get("host", [""])[0]
    forms = [
        f"postgresql://{user}:{SECRET}@{parts.netloc.rpartition('@')[2]}{name}?{query}",
        f"postgresql://{user}@{parts.netloc.rpartition('@')[2]}{name}?{query}&password={SECRET}",
        f"postgresql://{user}:{ENCODED}@{parts.netloc.rpartition('@')[2]}{name}?{query}",
        f"postgresql://{user}@{parts.netloc.rpartition('@')[2]}{name}?{query}&pass%77ord={ENCODED}",
        f"postgresql://{user}@{parts.netloc.rpartition('@')[2]}{name}?{query}"
        f"&options=-c%20application_name%3D{SECRET}&sslpassword={SECRET}",
    ]
    if hosts:  # a multi-host URL whose first server is missing: libpq goes on to the second
        forms.append(f"postgresql://{user}:{SECRET}@h1:5432,h2:5432{name}?host=/nowhere/memstream,{hosts}")
    else:
        forms.append(f"postgresql://{user}:{SECRET}@127.0.0.1:1,{parts.netloc.rpartition('@')[2]}{name}"
                     f"{'?' + query if query else ''}")
    return forms


def write_persona(folder: Path) -> Path:
    path = folder / "p.toml"
    path.write_text('[persona]\nname = "P"\nsummary = "P keeps secrets."\n[models]\n'
                    'base_url = "http://127.0.0.1:9/v1"\nmax_retries = 0\n', encoding="utf-8")
    return path


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A persona whose database is $MEMSTREAM_DATABASE_URL; no model key, no Discord token (those checks fail or
    are skipped without the network)."""
    for name in ("OPENAI_API_KEY", "DISCORD_TOKEN", "MEMSTREAM_DATA_DIR", "OPENAI_BASE_URL", "MEMSTREAM_PERSONA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    yield write_persona(tmp_path)


def run(argv: list[str], url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> tuple[int, str, str]:
    monkeypatch.setenv("MEMSTREAM_DATABASE_URL", url)
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_masking_of_each_form() -> None:
    for url in [*REFUSED, *AMBIGUOUS]:
        clean(redact(url))
        assert redact(redact(url)) == redact(url)
    assert redact("postgresql://u:p@h1:1,h2:2/x") == "postgresql://u:***@h1:1,h2:2/x"
    assert redact("postgresql://u@h/x?passfile=/home/u/.pgpass") == "postgresql://u@h/x?passfile=/home/u/.pgpass"
    assert redact(f"host=h password='{SECRET} x' dbname=x") == "host=h password=*** dbname=x"
    assert redact("/var/lib/memstream/p.db") == "/var/lib/memstream/p.db"
    assert redact(f"postgresql://h?user=a@b&password={SECRET}") == "postgresql://h?user=a@b&password=***"
    for url in REFUSED:
        assert url_problem(url) is None, url
    for url in AMBIGUOUS:
        problem = url_problem(url)
        assert problem is not None and "percent-encode" in problem
        clean(problem)


@pytest.mark.parametrize("url", REFUSED + AMBIGUOUS)
def test_doctor_and_stats_never_show_the_password_of_a_database_they_cannot_reach(
        url: str, env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    code, out, err = run(["doctor", "--persona", str(env)], url, monkeypatch, capsys)
    assert code == 1 and "Traceback" not in err
    database = [line for line in out.splitlines() if line[6:20].rstrip() in ("database", "persona")]
    assert any("127.0.0.1:1" in line and line.startswith("fail") for line in database), out
    clean(out + err)
    code, out, err = run(["doctor", "--persona", str(env), "--json"], url, monkeypatch, capsys)
    assert code == 1 and "Traceback" not in err
    json.loads(out)
    clean(out + err)
    code, out, err = run(["stats", "--persona", str(env), "--json"], url, monkeypatch, capsys)
    assert code != 0 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "127.0.0.1:1" in err
    clean(err)
    clean(caplog.text)


@pytest.mark.parametrize("url", REFUSED + AMBIGUOUS)
async def test_the_error_of_a_connection_that_fails_never_holds_the_password(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises((StoreError, ConfigError)) as info:
        await Store.open(url)
    assert "127.0.0.1:1" in str(info.value) and "\n" not in str(info.value)
    clean(str(info.value))
    clean(caplog.text)


async def test_doctor_stats_and_the_dashboard_show_a_reachable_database_masked(
        postgres_url: str, env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for url in planted(postgres_url):
        code, out, err = await asyncio.to_thread(run, ["doctor", "--persona", str(env)], url, monkeypatch, capsys)
        assert f"database {redact(url)}" in out and "ok    schema" in out, out
        clean(out + err)
        code, out, err = await asyncio.to_thread(run, ["doctor", "--persona", str(env), "--json"], url, monkeypatch,
                                                 capsys)
        checks = json.loads(out)
        assert "schema" in json.dumps(checks)
        clean(out + err)
        code, out, err = await asyncio.to_thread(run, ["stats", "--persona", str(env), "--json"], url, monkeypatch,
                                                 capsys)
        assert code == 0, err
        shown = json.loads(out)["database"]
        assert shown == redact(url) and shown.startswith("postgresql://")  # not <cwd>/postgresql:/...
        clean(out + err)
        store = await Store.open(url)
        memory = MemoryStream(store, FakeEmbedder(), rater=RoleModel(ScriptedChat(), "r"),
                              reflector=RoleModel(ScriptedChat(), "r"), agent=RoleModel(ScriptedChat(), "a"),
                              name="P", summary="P keeps secrets.")
        client = TestClient(TestServer(make_app(memory, WebOptions())))
        await client.start_server()
        try:
            pages = [await (await client.get(page)).text() for page in ("/", "/stats", "/timeline", "/insights")]
        finally:
            await client.close()
            await store.close()
        assert "postgresql://" in pages[0] and str(Path.cwd()) not in pages[0]
        for page in pages:
            clean(page)
    clean(caplog.text)


def test_libpq_key_value_strings_are_refused_without_their_password(
        env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Not a URL, such a string used to name a SQLite file, created and shown with the password in its name."""
    conninfo = f"host=127.0.0.1 port=1 dbname=x password={SECRET}"
    code, out, err = run(["doctor", "--persona", str(env)], conninfo, monkeypatch, capsys)
    assert code == 1 and "key=value" in out and "postgresql://" in out
    clean(out + err)
    code, out, err = run(["stats", "--persona", str(env), "--json"], conninfo, monkeypatch, capsys)
    assert code != 0 and "key=value" in err and err.count("\n") == 1
    clean(out + err)
    monkeypatch.delenv("MEMSTREAM_DATABASE_URL")
    with pytest.raises(SystemExit):
        main(["stats", "--persona", str(env), "--db", conninfo])
    out, err = capsys.readouterr()
    assert "key=value" in err
    clean(out + err)
    assert not list(env.parent.glob("host=*"))  # no SQLite file named after it
