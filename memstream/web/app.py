"""The dashboard's routes: each handler reads through MemoryStream (read-only, explain never touches) and
renders a page of memstream.web.pages; forgetting goes through MemoryStream.forget, as the CLI's does."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from memstream.config import show_database
from memstream.errors import ConfigError, MemoryNotFound, ProviderError
from memstream.records import ID_MAX
from memstream.render import tree_json
from memstream.stream import DEFAULT_STREAM, MemoryStream
from memstream.web.pages import Site, url
from memstream.web.security import Guard, security_headers

__all__ = ["STATIC", "WebOptions", "make_app"]

STATIC = Path(__file__).resolve().parent / "static"
PAGE = 200  # memories per timeline page
MAX_K = 100
MEMORY: web.AppKey[MemoryStream] = web.AppKey("memory", MemoryStream)
SITE: web.AppKey[Site] = web.AppKey("site", Site)
GUARD: web.AppKey[Guard] = web.AppKey("guard", Guard)


@dataclass(frozen=True)
class WebOptions:
    """How the dashboard runs: where it listens, whether it may forget, the token it requires (None: none)."""

    host: str = "127.0.0.1"
    port: int = 8765
    allow_forget: bool = False
    token: str | None = None


def make_app(memory: MemoryStream, options: WebOptions) -> web.Application:
    """The dashboard of one persona's memory (the caller opens and closes `memory`)."""
    guard = Guard(options.token)
    app = web.Application(middlewares=[guard.middleware], client_max_size=64 * 1024)
    app[MEMORY] = memory
    app[GUARD] = guard
    app[SITE] = Site(memory.name, database=show_database(memory.store.path),
                     can_forget=options.allow_forget, csrf=guard.csrf)
    app.on_response_prepare.append(security_headers)
    app.router.add_get("/", index)
    app.router.add_get("/timeline", timeline)
    app.router.add_get("/search", search)
    app.router.add_get("/insights", insights)
    app.router.add_get("/stats", stats)
    app.router.add_get("/memory/{id:\\d+}", memory_page)
    app.router.add_get("/memory/{id:\\d+}/evidence.json", evidence)
    app.router.add_post("/memory/{id:\\d+}/forget", forget)
    app.router.add_static("/static", STATIC)
    app.router.add_get("/favicon.ico", favicon)
    return app


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def _stream(request: web.Request) -> str:
    key = request.query.get("s", DEFAULT_STREAM)
    if not key.strip():
        raise web.HTTPBadRequest(text="the stream key (?s=) is empty\n")
    return key


def _number(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be a whole number, got {text[:40]!r}\n") from None
    if not low <= value <= high:
        raise web.HTTPBadRequest(text=f"{name} must be from {low} to {high}, got {value}\n")
    return value


def _memory_id(request: web.Request) -> int:
    """The id in the path (digits, by the route): past ID_MAX it names no memory (404), as a forgotten one."""
    text = request.match_info["id"]
    value = int(text) if len(text) <= len(str(ID_MAX)) else 0
    if not 1 <= value <= ID_MAX:
        raise web.HTTPNotFound(text=f"no memory #{text[:40]} (ids run from 1 to {ID_MAX})\n")
    return value


async def _get(request: web.Request) -> Any:
    try:
        return await request.app[MEMORY].get(_memory_id(request))
    except MemoryNotFound:
        raise web.HTTPNotFound(text=f"no memory #{request.match_info['id']} (forgotten, or never stored)\n") from None


async def favicon(request: web.Request) -> web.Response:
    """The icon, where browsers look for it unasked. Sent from memory: a browser often drops this request
    half-way, and aiohttp's FileResponse then leaves its file to the garbage collector (a ResourceWarning)."""
    return web.Response(body=await asyncio.to_thread((STATIC / "icon.svg").read_bytes), content_type="image/svg+xml")


async def index(request: web.Request) -> web.Response:
    """Every stream with its counts."""
    memory = request.app[MEMORY]
    rows = [(key, await memory.store.counts(key)) for key in await memory.store.streams()]
    return _html(request.app[SITE].index(rows))


async def timeline(request: web.Request) -> web.Response:
    """A page of a stream's memories, newest first."""
    stream = _stream(request)
    page = _number(request, "page", 0, 0, 10**9)
    found = await request.app[MEMORY].recent(stream, PAGE + 1, offset=page * PAGE)
    forgotten = request.query.get("forgotten")
    notice = (f"forgotten: {forgotten} memory(ies), with the insights and replies built on them"
              if forgotten and forgotten.isdigit() else None)
    return _html(request.app[SITE].timeline(stream, found[:PAGE], page=page, more=len(found) > PAGE, notice=notice))


async def search(request: web.Request) -> web.Response:
    """The ranking of a query with its score parts (MemoryStream.explain: no memory is touched)."""
    memory = request.app[MEMORY]
    stream = _stream(request)
    query = request.query.get("q", "").strip()
    k = _number(request, "k", memory.config.k, 1, MAX_K)
    items, error, status = None, None, 200
    if query:
        try:
            items = await memory.explain(query, stream=stream, k=k)
        except (ProviderError, ConfigError) as exc:  # the embedding model is down, or not configured
            error, status = f"search needs the embedding model: {exc}", 503
    return _html(request.app[SITE].search(stream, query, k, items, memory.config, error), status)


async def insights(request: web.Request) -> web.Response:
    """A page of a stream's reflections, newest first."""
    stream = _stream(request)
    page = _number(request, "page", 0, 0, 10**9)
    found = await request.app[MEMORY].store.recent(stream, PAGE + 1, offset=page * PAGE, kind="reflection")
    return _html(request.app[SITE].insights(stream, found[:PAGE], page=page, more=len(found) > PAGE))


async def stats(request: web.Request) -> web.Response:
    """One stream's stats (?s=KEY), or every stream's."""
    memory = request.app[MEMORY]
    stream = _stream(request) if "s" in request.query else None
    data = await memory.stats(stream)
    days = await memory.store.usage_by_day(stream)
    return _html(request.app[SITE].stats(stream, data, days))


async def memory_page(request: web.Request) -> web.Response:
    """One memory with its evidence graph."""
    m = await _get(request)
    tree = await request.app[MEMORY].why(m.id) if m.kind == "reflection" else None
    return _html(request.app[SITE].memory(m, tree))


async def evidence(request: web.Request) -> web.Response:
    """The evidence tree of a memory as nested JSON (as `memstream why --json`): the graph's data."""
    memory = request.app[MEMORY]
    try:
        tree = await memory.why(_memory_id(request))
    except MemoryNotFound:
        raise web.HTTPNotFound(text="no such memory\n") from None
    return web.json_response(tree_json(tree))


async def forget(request: web.Request) -> web.Response:
    """Forget one memory with everything built on it (only with --allow-forget, with the form's token)."""
    if not request.app[SITE].can_forget:
        raise web.HTTPForbidden(text="this dashboard is read-only: start it with --allow-forget to forget\n")
    await request.app[GUARD].check_form(request)
    m = await _get(request)
    gone = await request.app[MEMORY].forget([m.id])
    raise web.HTTPSeeOther(location=url("/timeline", s=m.stream, forgotten=len(gone)))
