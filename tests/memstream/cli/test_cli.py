"""The `memstream` command line, against the fake OpenAI server over HTTP."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memstream.cli import main
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer


def _persona(tmp_path: Path, base_url: str, threshold: int = 150) -> Path:
    path = tmp_path / "isabella.toml"
    path.write_text(
        '[persona]\nname = "Isabella Rodriguez"\nsummary = "Runs Hobbs Cafe."\n'
        f'database = "{tmp_path / "isabella.db"}"\n[models]\nbase_url = "{base_url}"\nmax_retries = 0\n'
        f"[memory]\nreflection_threshold = {threshold}\n", encoding="utf-8")
    return path


def _answer(request: ChatRequest) -> str:
    prompt = request.prompt
    if "Reply with a single integer" in prompt:
        return "7" if "party" in prompt else "1"
    if "most salient high-level" in prompt:
        return "What is Isabella planning?\nWho is invited?\nWhat did she eat?"
    if "high-level insights" in prompt:
        return "Isabella is planning a party (because of 1)"
    return "Come to my party!"


async def _cli(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_observe_recall_reflect_why_stats(tmp_path: Path, server: FakeOpenAIServer,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    assert await _cli("observe", "Isabella plans a Valentine's party", "--persona", persona,
                      "--at", "2023-02-13T08:00:00Z", "--json") == 0
    first = json.loads(capsys.readouterr().out)
    assert first["importance"] == 7 and first["importance_source"] == "rater"
    assert await _cli("observe", "toast for breakfast", "--persona", persona, "--at", "2023-02-13T12:00:00Z") == 0
    capsys.readouterr()
    assert await _cli("recall", "party tonight", "--persona", persona, "--json") == 0
    ranking = json.loads(capsys.readouterr().out)
    assert ranking[0]["memory"]["id"] == first["id"]
    assert set(ranking[0]) >= {"score", "recency", "importance", "relevance"}
    assert await _cli("reflect", "--persona", persona, "--json") == 0
    reflection = json.loads(capsys.readouterr().out)
    [insight] = reflection["insights"]
    assert await _cli("why", str(insight["id"]), "--persona", persona) == 0
    tree = capsys.readouterr().out
    assert "Isabella is planning a party" in tree and f"#{insight['evidence'][0]}" in tree
    assert await _cli("stats", "--persona", persona, "--stream", "default", "--json") == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["observations"] == 2 and stats["reflections"] == 1
    assert stats["usage"]["rater"]["calls"] == 2 and stats["usage"]["reflector"]["calls"] == 2
    # the resident budget, and what this command's own process holds (it scored nothing)
    assert stats["resident"] == {"streams": 0, "bytes": 0, "budget": 1024 << 20, "largest": 0, "drops": 0,
                                 "reloads": 0}
    assert await _cli("stats", "--persona", persona) == 0
    assert ("in memory in this process: 0 stream(s), 0 MiB of a 1024 MiB budget ([memory] resident_mb); "
            "0 dropped for it, 0 reloaded") in capsys.readouterr().out


async def test_import_is_validated_whole_and_resumable(tmp_path: Path, server: FakeOpenAIServer,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok", "at": "2023-01-01T00:00:00Z"}\n{"text": "", "at": "x"}\nnot json\n')
    assert await _cli("import", str(bad), "--persona", persona) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "line 3" in err and "nothing was imported" in err
    assert await _cli("stats", "--persona", persona, "--json") == 0
    assert json.loads(capsys.readouterr().out)["observations"] == 0

    good = tmp_path / "good.jsonl"
    lines = [{"text": f"note {i}", "at": f"2023-01-01T00:{i:02d}:00Z", "importance": 2} for i in range(40)]
    good.write_text("".join(json.dumps(line) + "\n" for line in lines[:25]))
    assert await _cli("import", str(good), "--persona", persona) == 0
    good.write_text("".join(json.dumps(line) + "\n" for line in lines))  # the rest of an interrupted file
    assert await _cli("import", str(good), "--persona", persona, "--json") == 0
    capsys.readouterr()
    assert await _cli("stats", "--persona", persona, "--json") == 0
    assert json.loads(capsys.readouterr().out)["observations"] == 40
    assert not server.chat_requests  # given importances skip the rater


async def test_chat_observes_and_answers_each_line(tmp_path: Path, server: FakeOpenAIServer) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "memstream", "chat", "--persona", persona, "--as", "Maria"],
        input="what are you doing tonight?\n\nsee you!\n", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["Isabella Rodriguez: Come to my party!"] * 2
    agent = [r.prompt for r in server.chat_requests if "What do you do or say next?" in r.prompt]
    assert len(agent) == 2 and 'Maria says to you: "see you!"' in agent[1]
    assert "Maria: what are you doing tonight?" in agent[1]  # the first line became a memory


@pytest.mark.parametrize(("argv", "message"), [
    (["observe", "x"], "OPENAI_API_KEY is not set"),
    (["chat"], "or try memstream with no key at all: add --local"),
    (["observe", "x", "--persona", "/nonexistent.toml"], "no such persona file"),
    (["recall", "x", "--at", "yesterday"], "not an ISO-8601 time"),
])
def test_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                             argv: list[str], message: str) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("MEMSTREAM_DATA_DIR", str(tmp_path))
    persona = tmp_path / "p.toml"
    persona.write_text('[persona]\nname = "P"\nsummary = "S"\n')
    if "--persona" not in argv:
        argv = [*argv, "--persona", str(persona)]
    with pytest.raises(SystemExit) if "--at" in argv else _nothing():
        code = main(argv)
        assert code == 2
    err = capsys.readouterr().err.strip()
    said = [line for line in err.splitlines() if not line.startswith(("usage:", " "))]  # beside argparse's usage
    assert len(said) == 1 and message in said[0] and "Traceback" not in err


def test_an_unreachable_server_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, "http://127.0.0.1:9/v1"))
    assert main(["observe", "hello", "--persona", persona]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot reach the model server at http://127.0.0.1:9/v1" in err
    assert "kept" in err  # the observation itself is not lost


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("chat", "observe", "import", "recall", "reflect", "why", "stats", "eval", "export", "bot"):
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        assert "usage: memstream " + command in capsys.readouterr().out


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


async def test_control_characters_in_memories_never_reach_the_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    evil = "party \x1b[2J\x1b]0;pwned\x07 at \x9b31m noon \u202eevil"

    def answer(request: ChatRequest) -> str:
        if "Reply with a single integer" in request.prompt:
            return "9"
        if "most salient high-level" in request.prompt:
            return "What is planned?\nWho comes?\nWhen?"
        if "high-level insights" in request.prompt:
            return f"Isabella plans a party {evil} (because of 1)"
        return f"Sure! {evil}"

    async with FakeOpenAIServer() as server:
        server.on_chat(answer)
        persona = str(_persona(tmp_path, server.base_url, threshold=5))
        assert await _cli("observe", evil, "--persona", persona, "--json") == 0
        capsys.readouterr()
        outputs = []
        for argv in (["recall", "party"], ["recall", "party", "--json"], ["reflect"], ["why", "2"],
                     ["why", "2", "--json"]):
            assert await _cli(*argv, "--persona", persona) == 0, argv
            outputs.append(capsys.readouterr().out)
        chat = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "memstream", "chat", "--persona", persona],
            input=f"hello {evil}\n", capture_output=True, text=True, timeout=60)
        outputs.append(chat.stdout + chat.stderr)
    for out in outputs:
        assert "party" in out or "Sure" in out or "Isabella" in out, out
        assert not any(ch in out for ch in "\x1b\x07\x9b\u202e"), repr(out)
    assert "␛[2J" in outputs[0]  # made visible, not silently dropped


async def test_an_import_survives_a_model_outage_and_a_rerun_completes_everything(tmp_path: Path) -> None:
    # The server dies after 300 rating calls (connections refused) and comes back on the same port.
    server = FakeOpenAIServer()
    await server.start()
    calls = 0
    stopping: list[asyncio.Task[None]] = []

    def answer(request: ChatRequest) -> str:
        nonlocal calls
        calls += 1
        if calls == 300:
            stopping.append(asyncio.ensure_future(server.stop()))
        return _answer(request)

    server.on_chat(answer)
    try:
        persona = str(_persona(tmp_path, server.base_url, threshold=20))
        history = tmp_path / "h.jsonl"
        history.write_text("".join(json.dumps({"text": f"the party plan number {i}", "id": str(i),
                                               "at": f"2023-02-13T{i % 24:02d}:00:00Z"}) + "\n"
                                   for i in range(1200)), encoding="utf-8")

        def run() -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "memstream", "import", str(history), "--persona", persona,
                                   "--reflect"], capture_output=True, text=True, timeout=300)

        first = await asyncio.to_thread(run)
        assert stopping, "the outage never happened"
        assert first.returncode == 3, first.stderr
        assert "Traceback" not in first.stderr
        last = first.stdout.strip().splitlines()[-1]
        assert "pending: the model server failed" in last and "run again" in last
        await asyncio.gather(*stopping)
        await server.start()  # back on the same port
        second = await asyncio.to_thread(run)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "pending:" not in second.stdout
        import sqlite3

        conn = sqlite3.connect(tmp_path / "isabella.db")
        counts = conn.execute("SELECT COUNT(*), SUM(status = 'ready') FROM memories WHERE kind = 'observation'")
        assert counts.fetchone() == (1200, 1200)
        conn.close()
    finally:
        await server.stop()


async def test_reimporting_says_what_was_already_there(tmp_path: Path, server: FakeOpenAIServer,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"text": f"note {i}", "at": "2023-01-01T00:00:00Z", "importance": 2}) + "\n"
                            for i in range(4)))
    assert await _cli("import", str(good), "--persona", persona) == 0
    assert "4 new, 0 already imported" in capsys.readouterr().out
    assert await _cli("import", str(good), "--persona", persona, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["new"], report["already_imported"]) == (0, 4)


async def test_an_import_says_which_streams_it_went_to(tmp_path: Path, server: FakeOpenAIServer,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    lines = tmp_path / "server.jsonl"
    lines.write_text("".join(json.dumps({"text": f"note {i}", "at": "2023-01-01T00:00:00Z", "importance": 2,
                                         "stream": "guild:111111111111111111"}) + "\n" for i in range(3)))
    assert await _cli("import", str(lines), "--persona", persona) == 0
    out = capsys.readouterr().out
    assert "stored in stream(s): guild:111111111111111111 (3)" in out
    assert "--stream guild:111111111111111111" in out
    assert await _cli("import", str(lines), "--persona", persona, "--json") == 0
    assert json.loads(capsys.readouterr().out)["streams"] == {"guild:111111111111111111": 3}
    assert await _cli("recall", "note", "--persona", persona) == 0  # the default stream: nothing there
    assert "has no memories yet; this database holds guild:111111111111111111: pass --stream KEY" in \
        capsys.readouterr().out


async def test_forget_of_an_id_that_does_not_exist_says_so_and_fails(tmp_path: Path, server: FakeOpenAIServer,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    assert await _cli("observe", "a real memory", "--importance", "3", "--persona", persona, "--json") == 0
    real = json.loads(capsys.readouterr().out)["id"]
    assert await _cli("forget", "99999", "--persona", persona) == 2
    out = capsys.readouterr().out
    assert "forgotten: 0 memory(ies)" in out and "no memory #99999" in out
    assert await _cli("forget", str(real), "99998", "--persona", persona, "--json") == 2
    report = json.loads(capsys.readouterr().out)
    assert report["forgotten"] == [real] and report["not_found"] == [99998]
    assert await _cli("forget", str(real), "--persona", persona) == 2  # gone now: not found, not "forgotten: 1"


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
async def test_observe_refuses_empty_text(tmp_path: Path, server: FakeOpenAIServer,
                                          capsys: pytest.CaptureFixture[str], text: str) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    assert await _cli("observe", text, "--persona", persona) == 2
    assert "needs some text" in capsys.readouterr().err
    assert await _cli("stats", "--persona", persona, "--json") == 0
    assert json.loads(capsys.readouterr().out)["observations"] == 0


async def test_observe_run_again_after_a_rater_outage_then_an_import_stores_the_text_once(
        tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    server.fail_next("500", path="chat")
    assert await _cli("observe", "Klaus plans the party", "--persona", persona) == 1
    assert "observing the same text again completes it" in capsys.readouterr().err
    assert await _cli("observe", "Klaus plans the party", "--persona", persona, "--json") == 0
    assert json.loads(capsys.readouterr().out)["id"] == 1
    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps({"text": "Maria likes tea", "at": "2023-01-01T00:00:00Z"}) + "\n")
    assert await _cli("import", str(history), "--persona", persona) == 0
    capsys.readouterr()
    assert await _cli("memories", "--persona", persona, "--json") == 0
    texts = sorted(m["text"] for m in json.loads(capsys.readouterr().out))
    assert texts == ["Klaus plans the party", "Maria likes tea"]


def test_the_histogram_is_drawn_as_bars() -> None:
    from memstream.render import histogram_lines

    lines = histogram_lines({1: 10, 2: 5, 3: 0, 4: 1}, width=20)
    assert lines[0] == "   1 " + "\u2588" * 20 + " 10"
    assert lines[1] == "   2 " + "\u2588" * 10 + " " * 10 + " 5"
    assert lines[2] == "   3 " + " " * 20 + " 0"
    assert lines[3].startswith("   4 \u2588\u2588") and lines[3].endswith(" 1")  # 1/10 of 20 cells: 2


async def test_stats_names_the_database_and_what_the_histogram_counts(tmp_path: Path, server: FakeOpenAIServer,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    assert await _cli("observe", "hello there", "--importance", "7", "--persona", persona) == 0
    capsys.readouterr()
    assert await _cli("stats", "--persona", persona) == 0
    out = capsys.readouterr().out
    assert f"database: {(tmp_path / 'isabella.db').resolve()}" in out
    assert "observations and reflections" in out
    assert "   7 " + "\u2588" * 40 + " 1" in out


def test_memstream_bot_logs_warnings_and_start_up_facts_like_python_m_bot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    persona = tmp_path / "p.toml"
    persona.write_text('[persona]\nname = "I"\nsummary = "S"\n', encoding="utf-8")
    monkeypatch.delenv("DISCORD_TOKEN", raising=False)
    names = ["", "aiosqlite", "httpx", "httpx2", "openai"]
    before = {name: logging.getLogger(name).level for name in names}
    root = logging.getLogger()
    try:
        assert main(["bot", "--persona", str(persona)]) == 2  # no token: one line, after logging is set up
        assert "DISCORD_TOKEN is not set" in capsys.readouterr().err
        assert root.level == logging.INFO  # not ERROR: the one warning line per fault shows
        assert logging.getLogger("aiosqlite").getEffectiveLevel() >= logging.INFO  # statements: never
        assert logging.getLogger("openai").getEffectiveLevel() == logging.WARNING
    finally:  # leave logging as the other tests expect it
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def test_version_and_bare_memstream_say_what_there_is(capsys: pytest.CaptureFixture[str]) -> None:
    import memstream

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"memstream {memstream.__version__}"
    assert main([]) == 2
    err = capsys.readouterr().err
    for command in ("chat", "observe", "import", "recall", "memories", "forget", "backup", "salvage", "bot"):
        assert command in err


def test_a_bad_number_names_its_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["observe", "hi", "--importance", "lots"])
    err = capsys.readouterr().err
    assert "argument --importance: must be a whole number from 1 to 10, got 'lots'" in err
    assert "_importance" not in err


async def test_recall_takes_k_either_way_and_a_profile_and_memories_lists(
        tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    for i in range(4):
        assert await _cli("observe", f"party note {i}", "--importance", str(i + 1), "--persona", persona) == 0
    capsys.readouterr()
    assert await _cli("recall", "party", "-k", "2", "--persona", persona, "--json") == 0
    short = json.loads(capsys.readouterr().out)
    assert await _cli("recall", "party", "--k", "2", "--persona", persona, "--json") == 0
    assert json.loads(capsys.readouterr().out) == short and len(short) == 2
    assert await _cli("recall", "party", "--k", "4", "--profile", "hybrid", "--persona", persona, "--json") == 0
    hybrid = json.loads(capsys.readouterr().out)
    assert await _cli("recall", "party", "--k", "4", "--persona", persona, "--json") == 0
    spec = json.loads(capsys.readouterr().out)
    assert [item["score"] for item in hybrid] != [item["score"] for item in spec]  # other weights
    assert await _cli("memories", "-n", "3", "--persona", persona) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("#4 ") and "party note 3" in lines[0]


async def test_chat_commands_start_with_a_slash_and_are_never_stored(tmp_path: Path, server: FakeOpenAIServer) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "memstream", "chat", "--persona", persona, "--as", "Maria"],
        input="/help\nwhat are you doing tonight?\n/why\n/nonsense now\n/quit\nnever said\n",
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "/why" in result.stderr and "/quit" in result.stderr  # the help
    assert "unknown command /nonsense" in result.stderr
    assert result.stdout.count("Isabella Rodriguez: Come to my party!") == 1
    agent = [r.prompt for r in server.chat_requests if "What do you do or say next?" in r.prompt]
    assert len(agent) == 1  # "/help", "/why", "/nonsense" and what came after /quit reached no model
    import sqlite3

    conn = sqlite3.connect(tmp_path / "isabella.db")
    texts = [row[0] for row in conn.execute("SELECT text FROM memories")]
    conn.close()
    assert not any("/" in text.split(":", 1)[-1][:3] or "never said" in text for text in texts)


async def test_ctrl_c_at_the_chat_prompt_ends_it_at_once(tmp_path: Path, server: FakeOpenAIServer) -> None:
    import signal

    persona = str(_persona(tmp_path, server.base_url))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memstream", "chat", "--persona", persona,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    banner = await asyncio.wait_for(proc.stderr.readline(), 30)
    assert b"Talking to" in banner
    await asyncio.sleep(0.3)  # waiting for a line, stdin still open
    proc.send_signal(signal.SIGINT)
    try:
        code = await asyncio.wait_for(proc.wait(), 5)  # at once, not after the next Enter
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 130
    rest = await proc.stderr.read()
    assert b"Traceback" not in rest


async def test_common_options_go_before_or_after_the_command_and_times_say_utc(
        tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    assert await _cli("--persona", persona, "observe", "a party at noon", "--importance", "4",
                      "--at", "2023-02-13T12:00:00Z") == 0
    capsys.readouterr()
    assert await _cli("--persona", persona, "--json", "stats") == 0
    assert json.loads(capsys.readouterr().out)["observations"] == 1  # the same database, JSON output
    assert await _cli("recall", "party", "--persona", persona) == 0
    out = capsys.readouterr().out
    assert "created (UTC)" in out and "2023-02-13 12:00" in out
    assert await _cli("why", "1", "--persona", persona) == 0
    assert "2023-02-13 12:00 UTC" in capsys.readouterr().out


async def test_import_reflects_only_when_asked_and_stamps_insights_with_the_history_time(
        tmp_path: Path, server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]) -> None:
    persona = str(_persona(tmp_path, server.base_url, threshold=20))
    history = tmp_path / "h.jsonl"
    history.write_text("".join(json.dumps({"text": f"the party plan {i}", "at": f"2023-02-13T{10 + i}:00:00Z"})
                               + "\n" for i in range(6)), encoding="utf-8")
    assert await _cli("import", str(history), "--persona", persona, "--json") == 0
    assert json.loads(capsys.readouterr().out)["due_for_reflection"]  # due, but not run without --reflect
    assert not [r for r in server.chat_requests if "most salient high-level" in r.prompt]
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"text": "the party plan, final", "at": "2023-02-14T09:00:00Z"}) + "\n",
                    encoding="utf-8")
    assert await _cli("import", str(more), "--persona", persona, "--reflect") == 0
    import sqlite3

    conn = sqlite3.connect(tmp_path / "isabella.db")
    stamps = [row[0] for row in conn.execute("SELECT created_at FROM memories WHERE kind = 'reflection'")]
    conn.close()
    assert stamps and all(datetime.fromtimestamp(t, UTC).year == 2023 for t in stamps)


@pytest.mark.parametrize("command", ["why", "forget"])
@pytest.mark.parametrize("number", ["99999999999999999999999", "9223372036854775808", "0", "12x"])
def test_a_memory_id_no_database_can_hold_is_a_usage_error(capsys: pytest.CaptureFixture[str], command: str,
                                                            number: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, number])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"must be a memory id, a whole number from 1 to 9223372036854775807, got '{number}'" in err
    assert "Traceback" not in err


async def test_stats_warn_of_a_rater_that_scores_everything_5(tmp_path: Path, server: FakeOpenAIServer,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    server.on_chat(lambda request: "5")
    persona = _persona(tmp_path, server.base_url)
    lines = [{"text": f"note {i}", "at": f"2023-01-01T00:{i:02d}:00Z"} for i in range(50)]
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert await _cli("import", str(history), "--persona", str(persona)) == 0
    capsys.readouterr()
    assert await _cli("stats", "--persona", str(persona)) == 0
    [warning] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("warning:")]
    assert "the rater looks miscalibrated: 50 of its last 50 ratings are 5" in warning
    assert await _cli("stats", "--persona", str(persona), "--json") == 0
    assert json.loads(capsys.readouterr().out)["rater"]["flat"] is True
    persona.write_text(persona.read_text() + "rater_alarm_window = 0\n")  # the switch
    assert await _cli("stats", "--persona", str(persona)) == 0
    assert "warning:" not in capsys.readouterr().out
    assert await _cli("stats", "--persona", str(persona), "--json") == 0
    assert json.loads(capsys.readouterr().out)["rater"] is None
