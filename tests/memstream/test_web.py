"""`memstream web`: the dashboard over real HTTP (aiohttp's test server on a socket): pages, the search
ranking against explain, the evidence graph's data, read-only, tokens, escaping of hostile memory text."""

from __future__ import annotations

import asyncio
import html
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from memstream.cli import main
from memstream.errors import ConfigError, MemoryNotFound
from memstream.records import RoleUsage
from memstream.render import tree_json
from memstream.store import NewMemory
from memstream.stream import MemoryStream
from memstream.testing import FakeClock, FakeEmbedder
from memstream.web import WebOptions, make_app, resolve_token
from memstream.web.charts import usage_svg
from memstream.web.html import h
from tests.conftest import MakeMemory
from tests.memstream.web_world import HOSTILE, OTHER, STREAM, World, build

TOKEN = "correct-horse-battery-staple"
Client = Callable[..., Awaitable[TestClient]]  # type: ignore[type-arg]


@pytest.fixture
async def world(make_memory: MakeMemory, embedder: FakeEmbedder, clock: FakeClock
                ) -> tuple[MemoryStream, World]:
    memory = make_memory()
    return memory, await build(memory, embedder, clock)


@pytest.fixture
async def client(world: tuple[MemoryStream, World]) -> AsyncIterator[Client]:
    """Start a dashboard over the world with the given options; every client is closed at the end."""
    opened: list[TestClient] = []  # type: ignore[type-arg]

    async def start(**options: object) -> TestClient:  # type: ignore[type-arg]
        running = TestClient(TestServer(make_app(world[0], WebOptions(**options))))  # type: ignore[arg-type]
        await running.start_server()
        opened.append(running)
        return running

    yield start
    for running in opened:
        await running.close()


def _ids(page: str, pattern: str) -> list[int]:
    return [int(i) for i in re.findall(pattern, page)]


async def test_index_lists_every_stream_with_counts(client: Client) -> None:
    c = await client()
    response = await c.get("/")
    assert response.status == 200 and response.content_type == "text/html"
    page = await response.text()
    assert "Maria" in page  # the persona's name in the header
    rows = re.findall(r"<tr><td><a href=\"/timeline\?s=([^\"]+)\"><code>[^<]+</code></a></td>"
                      r"<td class=\"n\">(\d+)</td><td class=\"n\">(\d+)</td><td class=\"n\">(\d+)</td>", page)
    assert rows == [("dm%3A2", "2", "0", "0"), ("guild%3A1", "6", "3", "0")]
    assert "read-only" in page


async def test_timeline_draws_every_memory_and_marks_reflections(client: Client,
                                                                 world: tuple[MemoryStream, World]) -> None:
    memory, w = world
    c = await client()
    page = await (await c.get("/timeline", params={"s": STREAM})).text()
    drawn = _ids(page, r'<a href="/memory/(\d+)" class="bar-link" data-id="\d+">')
    listed = _ids(page, r'<li class="memory \w+" data-id="(\d+)">')
    newest_first = [m.id for m in await memory.recent(STREAM, 50)]
    assert listed == newest_first and drawn == newest_first[::-1]  # the chart runs oldest to newest
    assert page.count('<rect class="bar reflection"') == 3 and page.count('<circle class="mark"') == 3
    assert '<rect class="bar imp9"' in page  # importance as colour
    tall = re.search(rf'data-id="{w.observations[5]}"><title>[^<]*</title><rect [^>]*height="([\d.]+)"', page)
    short = re.search(rf'data-id="{w.observations[4]}"><title>[^<]*</title><rect [^>]*height="([\d.]+)"', page)
    assert tall and short and float(tall.group(1)) == pytest.approx(9 * float(short.group(1)))  # as height
    beyond = await (await c.get("/timeline", params={"s": STREAM, "page": "1"})).text()
    assert "No memories on this page." in beyond and 'rel="prev" href="/timeline?s=guild%3A1&amp;page=0"' in beyond
    insights = await (await c.get("/insights", params={"s": STREAM})).text()
    assert _ids(insights, r'<li class="memory (?:\w+)" data-id="(\d+)">') == [w.deep, w.insight_b, w.insight_a]
    other = await (await c.get("/timeline", params={"s": OTHER})).text()
    assert "a direct message about painting" in other and "Klaus" not in other


async def test_search_shows_the_ranking_of_explain_and_touches_nothing(client: Client,
                                                                       world: tuple[MemoryStream, World]) -> None:
    memory, _ = world
    before = {m.id: m.last_accessed_at for m in await memory.recent(STREAM, 50)}
    c = await client()
    response = await c.get("/search", params={"s": STREAM, "q": "Klaus research at the cafe", "k": "7"})
    assert response.status == 200
    page = await response.text()
    expected = await memory.explain("Klaus research at the cafe", stream=STREAM, k=7)
    assert _ids(page, r'<tr class="ranked" data-id="(\d+)">') == [item.memory.id for item in expected]
    assert re.findall(r'<td class="n score">([\d.]+)</td>', page) == [f"{i.score:.3f}" for i in expected]
    first = expected[0]
    bar = re.search(r'<svg class="scorebar".*?</svg>', page)
    assert bar is not None
    widths = [float(x) for x in re.findall(r'<rect class="part \w+" x="[\d.]+" y="0" width="([\d.]+)"', bar.group())]
    total = 240 / 3  # spec weights 1, 1, 1: a part's width is 240 * value / 3
    assert widths == pytest.approx([total * first.recency, total * first.importance, total * first.relevance],
                                   abs=0.01)
    assert {m.id: m.last_accessed_at for m in await memory.recent(STREAM, 50)} == before


async def test_search_without_a_query_or_a_model_says_so(client: Client, world: tuple[MemoryStream, World],
                                                         embedder: FakeEmbedder) -> None:
    c = await client()
    empty = await c.get("/search", params={"s": STREAM})
    assert empty.status == 200 and 'class="ranked"' not in await empty.text()
    assert (await c.get("/search", params={"s": STREAM, "q": "x", "k": "0"})).status == 400
    embedder.fail_with = ConfigError("no API key: set OPENAI_API_KEY")
    down = await c.get("/search", params={"s": STREAM, "q": "painting in the park"})
    assert down.status == 503
    assert "search needs the embedding model: no API key: set OPENAI_API_KEY" in await down.text()


async def test_the_graph_endpoint_returns_the_evidence_tree(client: Client, world: tuple[MemoryStream, World]
                                                             ) -> None:
    memory, w = world
    c = await client()
    response = await c.get(f"/memory/{w.deep}/evidence.json")
    assert response.status == 200 and response.content_type == "application/json"
    tree = await response.json()
    assert tree == tree_json(await memory.why(w.deep))
    assert tree["depth"] == 2 and [child["id"] for child in tree["evidence"]] == [w.insight_a, w.insight_b,
                                                                                    w.observations[3]]
    assert [leaf["id"] for leaf in tree["evidence"][1]["evidence"]] == [w.observations[1], w.hostile]
    assert all(leaf["evidence"] == [] for leaf in tree["evidence"][1]["evidence"])
    assert (await c.get("/memory/999999/evidence.json")).status == 404
    page = await (await c.get(f"/memory/{w.deep}")).text()
    assert f'<div id="graph" class="graph" data-src="/memory/{w.deep}/evidence.json"></div>' in page
    assert page.count('<li><a href="/memory/') == 8  # the tree without script: the root and 7 descendants
    assert "#9 (its number in this stream" in page  # what Discord shows for it (the third insight of guild:1)


async def test_read_only_refuses_to_forget(client: Client, world: tuple[MemoryStream, World]) -> None:
    memory, w = world
    c = await client()
    page = await (await c.get(f"/memory/{w.observations[0]}")).text()
    assert "<form" not in page.replace('<form class="search"', "")
    response = await c.post(f"/memory/{w.observations[0]}/forget", data={"csrf": "anything"})
    assert response.status == 403 and "read-only" in await response.text()
    assert (await memory.get(w.observations[0])).id == w.observations[0]


async def test_forget_needs_the_form_token_and_cascades(client: Client, world: tuple[MemoryStream, World]
                                                         ) -> None:
    memory, w = world
    c = await client(allow_forget=True)
    page = await (await c.get(f"/memory/{w.observations[0]}")).text()
    csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert csrf is not None and "forget allowed" in page
    target = f"/memory/{w.observations[0]}/forget"
    assert (await c.post(target, data={"csrf": "0" * 64})).status == 403
    assert (await c.post(target, data={"csrf": csrf.group(1)}, headers={"Origin": "http://evil.example"})).status \
        == 403
    assert (await memory.get(w.observations[0])).id == w.observations[0]
    done = await c.post(target, data={"csrf": csrf.group(1), "sure": "on"}, allow_redirects=False)
    assert done.status == 303 and done.headers["Location"] == "/timeline?s=guild:1&forgotten=3"
    for gone in (w.observations[0], w.insight_a, w.deep):  # the same cascade as `memstream forget`
        with pytest.raises(MemoryNotFound):
            await memory.get(gone)
    assert (await memory.get(w.insight_b)).id == w.insight_b
    notice = await (await c.get(done.headers["Location"])).text()
    assert "forgotten: 3 memory(ies)" in notice


async def test_beyond_localhost_every_request_needs_the_token(client: Client) -> None:
    c = await client(host="0.0.0.0", token=TOKEN)
    for path in ("/", "/timeline?s=guild:1", "/static/dashboard.js", "/memory/1/evidence.json"):
        refused = await c.get(path)
        assert refused.status == 401, path
        assert "Klaus" not in await refused.text()
    assert (await c.get("/", headers={"Authorization": "Bearer wrong-token-wrong-token"})).status == 401
    assert (await c.get("/", params={"token": "wrong-token-wrong-token"})).status == 401
    assert (await c.get("/", headers={"Authorization": f"Bearer {TOKEN}"})).status == 200
    link = await c.get("/timeline", params={"s": STREAM, "token": TOKEN}, allow_redirects=False)
    assert link.status == 303 and link.headers["Location"] == "/timeline?s=guild:1"
    cookie = link.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    assert (await c.get("/timeline", params={"s": STREAM})).status == 200  # the cookie now carries it
    c.session.cookie_jar.clear()
    assert (await c.get("/timeline", params={"s": STREAM})).status == 401


async def test_without_a_token_only_loopback_hosts_are_answered(client: Client) -> None:
    c = await client()
    assert (await c.get("/", headers={"Host": "localhost:8765"})).status == 200
    assert (await c.get("/", headers={"Host": "[::1]:8765"})).status == 200
    rebound = await c.get("/", headers={"Host": "attacker.example:8765"})  # DNS rebinding
    assert rebound.status == 403 and "Klaus" not in await rebound.text()


def test_a_token_is_required_beyond_localhost() -> None:
    assert resolve_token("127.0.0.1", None, {}) is None
    assert resolve_token("localhost", None, {}) is None
    assert resolve_token("0.0.0.0", None, {"MEMSTREAM_WEB_TOKEN": TOKEN}) == TOKEN
    assert resolve_token("::1", TOKEN, {"MEMSTREAM_WEB_TOKEN": "ignored-because-given"}) == TOKEN
    with pytest.raises(ConfigError, match=r"--host 0\.0\.0\.0 lets other machines in"):
        resolve_token("0.0.0.0", None, {})
    with pytest.raises(ConfigError, match="at least 16 characters"):
        resolve_token("192.168.1.5", "short", {})


def test_the_command_refuses_a_public_host_without_a_token(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMSTREAM_WEB_TOKEN", raising=False)
    persona = tmp_path / "p.toml"
    persona.write_text(f'[persona]\nname = "P"\nsummary = "S"\ndatabase = "{tmp_path / "p.db"}"\n')
    assert main(["web", "--persona", str(persona), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give a token with --token or $MEMSTREAM_WEB_TOKEN" in err
    assert not (tmp_path / "p.db").exists()  # refused before the database was opened
    assert main(["web", "--persona", str(persona), "--port", "70000"]) == 2
    assert "--port must be from 0 to 65535" in capsys.readouterr().err


async def test_hostile_memory_text_is_escaped_on_every_page(client: Client, world: tuple[MemoryStream, World]
                                                            ) -> None:
    _, w = world
    c = await client(allow_forget=True)
    pages = [f"/timeline?s={STREAM}", f"/memory/{w.hostile}", f"/memory/{w.insight_b}", f"/memory/{w.deep}",
             f"/search?s={STREAM}&q=alert+pwned+ignore", f"/insights?s={STREAM}",
             f"/search?s={STREAM}&q=%3Cscript%3Ealert(1)%3C/script%3E"]
    escaped = html.escape(HOSTILE.replace("\u202e", "\\u202e"), quote=True)
    for path in pages:
        page = await (await c.get(path)).text()
        assert "<script>" not in page and "</memory>" not in page and "<b>" not in page, path
        assert "\u202e" not in page, path  # a bidi override is shown, not obeyed
        if path.startswith("/search?s=guild%3A1&q=%3C") or "q=%3C" in path:
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the query echoed in the box
        elif "insights" not in path:
            assert escaped in page or html.escape("<script>alert('pwned')</script>", quote=True) in page, path
    assert h("<p>{0}</p>", "<i>") == "<p>&lt;i&gt;</p>"


async def test_every_response_carries_the_security_headers(client: Client) -> None:
    c = await client()
    for path, status in (("/", 200), ("/static/dashboard.js", 200), ("/static/dashboard.css", 200),
                         ("/memory/999999", 404), ("/nowhere", 404)):
        response = await c.get(path)
        assert response.status == status, path
        csp = response.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    js = await c.get("/static/dashboard.js")
    assert js.content_type in ("application/javascript", "text/javascript")
    page = await (await c.get("/")).text()
    assert "<script>" not in page and 'style="' not in page and " on" not in re.sub(r">[^<]*<", "><", page)


async def test_stats_show_the_histogram_and_calls_per_role_and_day(client: Client,
                                                                   world: tuple[MemoryStream, World]) -> None:
    memory, _ = world
    c = await client()
    page = await (await c.get("/stats", params={"s": STREAM})).text()
    data = await memory.stats(STREAM)
    for importance, n in data.counts.histogram.items():
        assert f"<title>importance {importance}: {n} memories</title>" in page
    assert re.search(r"role-agent\"></span> agent</td><td class=\"n\">2</td><td class=\"n\">1</td>", page)
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert f"<title>{today}: rater 6 calls</title>" in page
    assert f"<title>{today}: agent 980 tokens</title>" in page
    days = await memory.store.usage_by_day(STREAM)
    assert {(d.strftime("%Y-%m-%d"), role) for d, role, _ in days} >= {(today, "rater"), (today, "agent")}
    everything = await (await c.get("/stats")).text()
    assert f"<title>{today}: embedding" in everything and "Stats</h1>" in everything
    await memory.retrieve("anything", stream=STREAM)  # this process now holds the stream
    resident = memory.index.resident.stats()
    assert resident.streams == 1 and resident.bytes > 0
    page = await (await c.get("/stats")).text()
    assert f"In memory in the dashboard process: {resident.text()}.</p>" in page, page[page.find("In memory"):][:200]


async def test_stats_warn_of_a_rater_that_scores_everything_5(client: Client, world: tuple[MemoryStream, World],
                                                              embedder: FakeEmbedder) -> None:
    memory, _ = world
    c = await client()
    alarm = "the rater looks miscalibrated"
    assert alarm not in await (await c.get("/stats", params={"s": STREAM})).text()  # no rater ratings yet
    dim = len((await embedder.embed_batch(["x"]))[0])
    await memory.store.insert([NewMemory(stream=STREAM, kind="observation", text=f"chat {i}", created_at=1e9 + i,
                                         importance=5, importance_source="rater",
                                         embedding=np.ones(dim, np.float32)) for i in range(50)])
    page = await (await c.get("/stats", params={"s": STREAM})).text()
    assert '<p class="error">Warning: the rater looks miscalibrated: 50 of its last 50 ratings are 5' in page
    assert alarm in await (await c.get("/stats")).text()  # every stream
    assert alarm not in await (await c.get("/stats", params={"s": OTHER})).text()  # another stream's own ratings


async def test_the_command_serves_until_stopped(tmp_path: Path) -> None:
    persona = tmp_path / "p.toml"
    persona.write_text(f'[persona]\nname = "Pat"\nsummary = "S"\ndatabase = "{tmp_path / "p.db"}"\n'
                       '[models]\napi_key_env = "MEMSTREAM_TEST_NO_SUCH_KEY"\n')
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memstream", "web", "--persona", str(persona), "--port", "0",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None and process.stderr is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        found = re.search(r"at (http://127\.0\.0\.1:\d+/) \(read-only\)", line)
        assert found, line + (await process.stderr.read()).decode()
        async with aiohttp.ClientSession() as session, session.get(found.group(1)) as response:
            assert response.status == 200 and "Pat" in await response.text()
    finally:
        process.terminate()
        await process.wait()
    assert "search is off" in (await process.stderr.read()).decode()


async def test_usage_is_counted_per_day_and_purged_with_its_stream(world: tuple[MemoryStream, World]) -> None:
    memory, _ = world
    await memory.store.record_usage_many([(STREAM, "rater", 4, 1, 40, 4, 2), (STREAM, "reflector", 1, 0, 9, 9, 0)])
    days = {role: counts for _, role, counts in await memory.store.usage_by_day(STREAM)}
    totals = await memory.store.usage(STREAM)
    assert days["rater"] == totals["rater"] == RoleUsage(calls=10, failures=1, prompt_tokens=640, completion_tokens=10)
    assert days["reflector"] == totals["reflector"]
    await memory.purge(STREAM)
    assert await memory.store.usage_by_day(STREAM) == []
    assert [role for _, role, _ in await memory.store.usage_by_day()] == ["embedding"]  # the other stream's


def test_the_usage_chart_shows_days_without_calls_and_one_year_at_most() -> None:
    def day(n: int) -> datetime:
        return datetime(2024, 1, 1, tzinfo=UTC) + timedelta(days=n)

    calls = RoleUsage(calls=3, failures=0, prompt_tokens=10, completion_tokens=5)
    chart = usage_svg([(day(0), "rater", calls), (day(3), "agent", calls), (day(3), "rater", calls)], "calls")
    bars = re.findall(r'<rect class="bar (role-\w+)" x="([\d.]+)"[^>]*><title>([\d-]+):', chart)
    assert [(role, date) for role, _, date in bars] == [("role-rater", "2024-01-01"), ("role-rater", "2024-01-04"),
                                                        ("role-agent", "2024-01-04")]
    slot = (float(bars[1][1]) - float(bars[0][1])) / 3  # four slots: two days without calls between
    assert slot == pytest.approx(944 / 4, abs=0.1)
    long = usage_svg([(day(0), "rater", calls), (day(500), "rater", calls)], "tokens")
    assert "2024-01-01" not in long and re.findall(r"<title>[\d-]+: rater (\d+) tokens", long) == ["15"]


async def test_an_id_no_database_can_hold_is_a_404_not_a_500(client: Client) -> None:
    c = await client()
    for path in ("/memory/9223372036854775808", "/memory/99999999999999999999999",
                 "/memory/9223372036854775808/evidence.json", "/memory/0", "/memory/" + "9" * 5000):
        response = await c.get(path)
        assert response.status == 404, path
        assert "no memory #" in (await response.text())


async def test_stats_show_the_days_spend_against_the_budget(make_memory: MakeMemory, embedder: FakeEmbedder,
                                                            clock: FakeClock) -> None:
    from memstream.config import BudgetConfig, RoleLimit

    memory = make_memory(budget=BudgetConfig({"rater": RoleLimit(calls_per_day=6),
                                              "agent": RoleLimit(calls_per_day=50, tokens_per_day=2000)}))
    await build(memory, embedder, clock)
    running = TestClient(TestServer(make_app(memory, WebOptions())))  # type: ignore[arg-type]
    await running.start_server()
    try:
        page = await (await running.get("/stats", params={"s": OTHER})).text()  # the persona's: every stream
    finally:
        await running.close()
    assert "<h3>Budget today</h3>" in page and "it renews at 00:00 UTC" in page
    rows = re.findall(r"<tr><td><span class=\"key role-(\w+)\"></span> \w+</td><td>(.*?)</td><td>(.*?)</td>"
                      r"<td>(.*?)</td></tr>", page)
    budget = {role: (calls, tokens, state) for role, calls, tokens, state in rows if "meter" in calls}
    renews = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%d 00:00")
    assert budget["rater"][0].startswith('6 / 6 <meter min="0" max="6"')
    assert budget["rater"][1] == '606 <span class="meta">(no limit)</span>'
    assert budget["rater"][2] == f'<span class="badge danger">spent until {renews} UTC</span>'
    assert budget["agent"][0].startswith("2 / 50 <meter") and budget["agent"][1].startswith("980 / 2000 <meter")
    assert budget["agent"][2] == "within budget"
    off = await make_memory().stats()
    assert off.budget == ()
