"""The dashboard in a real headless Chromium (Debian's `chromium`; .ci/run installs it): every page renders,
the evidence graph is drawn by its script, nothing goes wrong in the page (no exception, no console or log
error: a CSP violation or a failed load would be one), hostile memory text stays text. A screenshot of each
page is kept under $MEMSTREAM_TEST_ARTIFACTS (default: the test's tmp dir)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from memstream.stream import MemoryStream
from memstream.testing import FakeClock, FakeEmbedder
from memstream.web import WebOptions, make_app
from tests.conftest import MakeMemory
from tests.memstream.browser import Browser, Page, chromium, launch
from tests.memstream.web_world import HOSTILE, STREAM, World, build

EXECUTABLE = chromium()
pytestmark = pytest.mark.skipif(EXECUTABLE is None, reason="no chromium on this machine (Debian: apt-get install "
                                                          "chromium; .ci/run installs it)")
TOKEN = "a-token-long-enough-to-count"


@pytest.fixture
def artifacts(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    root = os.environ.get("MEMSTREAM_TEST_ARTIFACTS")
    folder = (Path(root) if root else tmp_path) / "web" / request.node.name
    shutil.rmtree(folder, ignore_errors=True)  # the last run's pictures only
    return folder


@pytest.fixture
async def world(make_memory: MakeMemory, embedder: FakeEmbedder, clock: FakeClock
                ) -> tuple[MemoryStream, World]:
    memory = make_memory()
    return memory, await build(memory, embedder, clock)


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    assert EXECUTABLE is not None
    async with launch(EXECUTABLE, tmp_path / "chromium-profile") as running:
        yield running


def _pictures(folder: Path) -> list[str]:
    """The PNG files of a folder that hold a real picture (not a blank page)."""
    return sorted(p.name for p in folder.iterdir() if p.read_bytes().startswith(b"\x89PNG") and p.stat().st_size > 5000)


async def _serve(memory: MemoryStream, options: WebOptions) -> TestServer:
    server = TestServer(make_app(memory, options))
    await server.start_server()
    return server


async def _visit(page: Page, url: str, shot: Path) -> None:
    assert await page.goto(url) == 200, url
    assert await page.run("document.styleSheets.length === 1 && document.styleSheets[0].cssRules.length > 20")
    await page.screenshot(shot)


async def test_every_page_renders_and_the_graph_draws(world: tuple[MemoryStream, World], browser: Browser,
                                                      artifacts: Path) -> None:
    memory, w = world
    server = await _serve(memory, WebOptions(allow_forget=True))
    try:
        base = str(server.make_url("/"))
        page = await browser.page()
        await _visit(page, base, artifacts / "1-streams.png")
        assert await page.run("[...document.querySelectorAll('table.streams code')].map(e => e.textContent)") \
            == ["dm:2", "guild:1"]

        await _visit(page, f"{base}timeline?s={STREAM}", artifacts / "2-timeline.png")
        assert await page.run("document.querySelectorAll('svg.timeline a.bar-link').length") == 9
        assert await page.run("document.querySelectorAll('svg.timeline rect.reflection').length") == 3
        shown = await page.run(f"document.querySelector('li[data-id=\"{w.hostile}\"] .text').textContent")
        assert shown == HOSTILE.replace("\u202e", "\\u202e")  # text, not markup; the bidi override made visible
        assert await page.run("document.querySelectorAll('main script, main b').length") == 0

        await _visit(page, f"{base}search?s={STREAM}&q=Klaus+research+cafe&k=5", artifacts / "3-search.png")
        expected = [item.memory.id for item in await memory.explain("Klaus research cafe", stream=STREAM, k=5)]
        assert await page.run("[...document.querySelectorAll('tr.ranked')].map(r => Number(r.dataset.id))") \
            == expected
        assert await page.run("document.querySelectorAll('svg.scorebar rect.part').length") == 15

        await _visit(page, f"{base}memory/{w.deep}", artifacts / "4-evidence-graph.png")
        assert await page.wait_for("document.getElementById('graph').dataset.drawn") == "7"
        nodes = await page.run("[...document.querySelectorAll('#graph svg a.node')].map(a => "
                               "[Number(a.dataset.id), Number(a.querySelector('rect').getAttribute('y'))])")
        rows = dict(nodes)
        assert set(rows) == {w.deep, w.insight_a, w.insight_b, *w.observations[:4]}
        assert rows[w.deep] < rows[w.insight_a] == rows[w.insight_b] < rows[w.observations[0]]  # depth as height
        assert await page.run("document.querySelectorAll('#graph svg line.edge').length") == 7
        label = await page.run(f"document.querySelector('#graph a[data-id=\"{w.hostile}\"] title').textContent")
        assert "<script>alert('pwned')</script>" in label
        assert await page.run("document.querySelectorAll('#graph script, #graph b').length") == 0
        assert await page.run("document.querySelector('form.forget button').textContent") == "forget"

        await _visit(page, f"{base}insights?s={STREAM}", artifacts / "5-insights.png")
        assert await page.run("document.querySelectorAll('li.reflection').length") == 3

        await _visit(page, f"{base}stats?s={STREAM}", artifacts / "6-stats.png")
        assert await page.run("document.querySelectorAll('svg.histogram rect.bar').length") == 10
        assert await page.run("document.querySelectorAll('svg.usage-calls rect.bar').length") >= 2

        await _visit(page, f"{base}stats", artifacts / "7-stats-all.png")
        assert page.problems() == []
        assert _pictures(artifacts) == ["1-streams.png", "2-timeline.png", "3-search.png", "4-evidence-graph.png",
                                        "5-insights.png", "6-stats.png", "7-stats-all.png"]
    finally:
        await server.close()


async def test_a_token_link_lets_the_browser_in_and_the_graph_loads_with_its_cookie(
        world: tuple[MemoryStream, World], browser: Browser, artifacts: Path) -> None:
    memory, w = world
    server = await _serve(memory, WebOptions(host="0.0.0.0", token=TOKEN))
    try:
        page = await browser.page()
        assert await page.goto(str(server.make_url(f"/memory/{w.insight_a}"))) == 401
        assert await page.goto(str(server.make_url(f"/memory/{w.insight_a}?token={TOKEN}"))) == 200
        assert await page.run("location.search") == ""  # the token left the address bar
        assert await page.wait_for("document.getElementById('graph').dataset.drawn") == "3"
        assert await page.run("document.cookie") == ""  # HttpOnly: script cannot read it
        await page.screenshot(artifacts / "graph-with-token.png")
        tree = json.loads(await page.run(f"fetch('/memory/{w.insight_a}/evidence.json').then(r => r.text())"))
        assert tree["id"] == w.insight_a
        problems = page.problems()
        # The one expected error: the first load without the token was refused (401).
        assert [p for p in problems if "401" not in p] == [] and len(problems) == 1, problems
    finally:
        await server.close()
