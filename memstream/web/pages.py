"""The dashboard's pages as HTML, from plain data (handlers in memstream.web.app fetch it). Every value goes
through memstream.web.html's escaping; scripts and styles are files under /static/ (no inline code)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from memstream.config import StreamConfig
from memstream.records import Counts, EvidenceNode, Memory, RoleBudget, RoleUsage, ScoredMemory, Stats
from memstream.render import rater_alarm
from memstream.web.charts import histogram_svg, score_bar_svg, timeline_svg, usage_svg
from memstream.web.html import Safe, h, join

__all__ = ["Site", "url"]


def url(path: str, **params: Any) -> str:
    """A path with its query (parameters that are None are left out)."""
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return f"{path}?{query}" if query else path


def _when(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def _importance(m: Memory) -> Safe:
    if m.importance is None:
        return Safe('<span class="pill pending">pending</span>')
    return h('<span class="pill imp{0}" title="importance ({1})">{0}</span>', m.importance, m.importance_source)


def _kind(m: Memory) -> Safe:
    if m.kind == "reflection":
        return h('<span class="kind reflection">reflection · depth {0}</span>', m.depth)
    return Safe('<span class="kind observation">observation</span>')


def _memory_row(m: Memory) -> Safe:
    author = h(' <span class="author">{0}</span>', m.source.author) if m.source.author else Safe("")
    return h('<li class="memory {0}" data-id="{1}"><a class="id" href="/memory/{1}">#{1}</a> {2} {3} '
             '<time>{4}</time>{5}<div class="text">{6}</div></li>',
             m.kind, m.id, _importance(m), _kind(m), _when(m.created_at), author, m.text)


class Site:
    """Renders the pages of one persona's dashboard."""

    def __init__(self, persona: str, *, database: str, can_forget: bool, csrf: str) -> None:
        self.persona = persona
        self.database = database
        self.can_forget = can_forget
        self.csrf = csrf

    def layout(self, title: str, body: Safe, *, stream: str | None = None, current: str = "") -> str:
        """The page around a body: head, header with the mode, the stream's navigation."""
        mode = (Safe('<span class="badge danger">forget allowed</span>') if self.can_forget
                else Safe('<span class="badge">read-only</span>'))
        nav = Safe("")
        if stream is not None:
            links = [h('<a href="{0}"{1}>{2}</a>', url(path, s=stream),
                       Safe(' aria-current="page"') if name == current else Safe(""), name)
                     for name, path in (("Timeline", "/timeline"), ("Search", "/search"),
                                        ("Insights", "/insights"), ("Stats", "/stats"))]
            nav = h('<nav><span class="stream">stream <code>{0}</code></span> {1}</nav>', stream, join(links, " "))
        return h('<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
                 '<meta name="viewport" content="width=device-width, initial-scale=1">'
                 '<title>{0} · {1} · memstream</title>'
                 '<link rel="stylesheet" href="/static/dashboard.css">'
                 '<link rel="icon" href="/static/icon.svg" type="image/svg+xml">'
                 '<script src="/static/dashboard.js" defer></script></head>'
                 '<body><header><a class="home" href="/">{1}</a> <span class="subtitle">memory dashboard</span> '
                 '{2}{3}</header><main>{4}</main></body></html>\n',
                 title, self.persona, mode, nav, body)

    def index(self, rows: Sequence[tuple[str, Counts]]) -> str:
        """Every stream with its counts."""
        if not rows:
            table = Safe('<p class="empty">No memories yet: import some (memstream import) or run the bot.</p>')
        else:
            body = join(h('<tr><td><a href="{0}"><code>{1}</code></a></td><td class="n">{2}</td><td class="n">{3}'
                          '</td><td class="n">{4}</td><td class="n">{5}</td><td><a href="{6}">search</a> · '
                          '<a href="{7}">insights</a> · <a href="{8}">stats</a></td></tr>',
                          url("/timeline", s=key), key, c.observations, c.reflections, c.pending,
                          c.observations + c.reflections, url("/search", s=key), url("/insights", s=key),
                          url("/stats", s=key)) for key, c in rows)
            table = h('<table class="streams"><thead><tr><th>stream</th><th>observations</th><th>reflections</th>'
                      '<th>pending</th><th>total</th><th></th></tr></thead><tbody>{0}</tbody></table>', body)
        return self.layout("Streams", h('<h1>Streams</h1>{0}<p class="meta">database <code>{1}</code> · '
                                        '<a href="/stats">stats of every stream</a></p>', table, self.database))

    def timeline(self, stream: str, newest_first: Sequence[Memory], *, page: int, more: bool,
                 notice: str | None) -> str:
        """A page of a stream's memories: the chart (oldest left), then the list (newest first)."""
        note = h('<p class="notice" role="status">{0}</p>', notice) if notice else Safe("")
        pager = _pager("/timeline", stream, page, more)
        if not newest_first:
            body = Safe('<p class="empty">No memories on this page.</p>')
        else:
            body = h('<figure>{0}<figcaption>Height and colour: importance (1-10). <span class="key reflection">'
                     '</span> reflection (dot on top) · <span class="key pending"></span> pending (not rated yet). '
                     'Click a bar to open the memory.</figcaption></figure><ol class="memories">{1}</ol>',
                     timeline_svg(list(reversed(newest_first))), join(_memory_row(m) for m in newest_first))
        return self.layout(f"Timeline of {stream}", h('<h1>Timeline</h1>{0}{1}<p class="pager">{2}</p>',
                                                      note, body, pager), stream=stream, current="Timeline")

    def search(self, stream: str, query: str, k: int, items: Sequence[ScoredMemory] | None, config: StreamConfig,
               error: str | None) -> str:
        """The search box and, for a query, the ranking with each score's parts."""
        form = h('<form class="search" method="get" action="/search"><input type="hidden" name="s" value="{0}">'
                 '<input type="search" name="q" value="{1}" placeholder="what would the persona recall?" '
                 'autofocus aria-label="query"> <label>k <input type="number" name="k" min="1" max="100" '
                 'value="{2}"></label> <button type="submit">rank</button></form>'
                 '<p class="meta">Profile <code>{3}</code>: score = {4} × recency + {5} × importance + {6} × '
                 'relevance (each part normalized to 0-1). Read-only: searching here refreshes no memory\'s '
                 'last access.</p>', stream, query, k, config.profile, f"{config.weight_recency:g}",
                 f"{config.weight_importance:g}", f"{config.weight_relevance:g}")
        legend = Safe('<p class="legend"><span class="key recency"></span> recency <span class="key importance">'
                      '</span> importance <span class="key relevance"></span> relevance</p>')
        if error is not None:
            result = h('<p class="error" role="alert">{0}</p>', error)
        elif items is None:
            result = Safe("")
        elif not items:
            result = Safe('<p class="empty">This stream has no memories to rank.</p>')
        else:
            rows = join(h('<tr class="ranked" data-id="{0}"><td class="n">{1}</td><td><a href="/memory/{0}">#{0}</a>'
                          '</td><td class="n score">{2}</td><td>{3}</td><td class="n">{4}</td><td class="n">{5}</td>'
                          '<td class="n">{6}</td><td>{7} {8}<div class="text">{9}</div></td></tr>',
                          item.memory.id, rank, f"{item.score:.3f}", score_bar_svg(item, config),
                          f"{item.recency:.2f}", f"{item.importance:.2f}", f"{item.relevance:.2f}",
                          _kind(item.memory), _importance(item.memory), item.memory.text)
                        for rank, item in enumerate(items, 1))
            result = h('{0}<table class="ranking"><thead><tr><th>#</th><th>id</th><th>score</th><th>parts</th>'
                       '<th>rec</th><th>imp</th><th>rel</th><th>memory</th></tr></thead><tbody>{1}</tbody></table>',
                       legend, rows)
        return self.layout(f"Search {stream}", h('<h1>Search</h1>{0}{1}', form, result), stream=stream,
                           current="Search")

    def memory(self, m: Memory, tree: EvidenceNode | None) -> str:
        """One memory, its evidence graph (a reflection) and, when allowed, the forget form."""
        src = m.source
        facts: list[tuple[str, str]] = [("stream", h("<code>{0}</code>", m.stream))]
        if m.number is not None:
            facts.append(("on Discord", f"#{m.number} (its number in this stream, as /memories shows it)"))
        facts += [("kind", _kind(m)), ("importance", _importance(m)), ("created", _when(m.created_at)),
                 ("last accessed", _when(m.last_accessed_at)), ("status", m.status)]
        facts += [(name, value) for name, value in (("author", src.author), ("author id", src.author_id),
                                                    ("channel", src.channel), ("message id", src.message_id))
                  if value]
        table = join(h("<tr><th>{0}</th><td>{1}</td></tr>", name, value) for name, value in facts)
        graph = Safe("")
        if tree is not None and tree.evidence:
            graph = h('<section><h2>Evidence</h2><p class="meta">Down to the observations; a reflection built on '
                      'reflections sits higher (depth).</p><div id="graph" class="graph" data-src="{0}"></div>'
                      '<ul class="tree">{1}</ul></section>', f"/memory/{m.id}/evidence.json", _tree_items(tree))
        elif m.kind == "reflection":
            graph = Safe('<p class="meta">No evidence left: what it cited was forgotten.</p>')
        forget = Safe("")
        if self.can_forget:
            forget = h('<form class="forget" method="post" action="/memory/{0}/forget">'
                       '<input type="hidden" name="csrf" value="{1}"><label><input type="checkbox" name="sure" '
                       'required> forget #{0}, and every insight and reply built on it</label> '
                       '<button type="submit" class="danger">forget</button></form>', m.id, self.csrf)
        body = h('<h1>Memory #{0}</h1><div class="text big">{1}</div><table class="facts">{2}</table>{3}{4}',
                 m.id, m.text, table, graph, forget)
        return self.layout(f"Memory #{m.id}", body, stream=m.stream)

    def insights(self, stream: str, reflections: Sequence[Memory], *, page: int, more: bool) -> str:
        """A page of a stream's reflections, newest first."""
        if not reflections:
            body = Safe('<p class="empty">No reflections yet: they come once the importance observed reaches the '
                        'threshold (memstream reflect runs one now).</p>')
        else:
            body = h('<ol class="memories">{0}</ol>', join(_memory_row(m) for m in reflections))
        return self.layout(f"Insights of {stream}", h('<h1>Insights</h1>{0}<p class="pager">{1}</p>', body,
                                                      _pager("/insights", stream, page, more)),
                           stream=stream, current="Insights")

    def stats(self, stream: str | None, data: Stats, days: Sequence[tuple[datetime, str, RoleUsage]]) -> str:
        """Counts, the importance histogram, reflection progress, model usage (totals and per day)."""
        hist = data.counts.histogram
        counts = h('<p>{0} observations, {1} reflections, {2} pending ({3} failed attempts), {4} fallback '
                   'ratings.</p>', data.counts.observations, data.counts.reflections, data.pending.count,
                   data.pending.failed_attempts, data.counts.fallback)
        progress = Safe("")
        state = data.state
        if state is not None:
            last = state.last_reflection_at
            progress = h('<p>Towards the next reflection: {0} / {1} importance (reflections run {2}, skipped {3}; '
                         'last {4}).</p>', state.importance_since_reflection, data.reflection_threshold,
                         state.reflections, state.skipped_reflections,
                         "never" if last is None else _when(last.astimezone(UTC)))
        usage = data.usage
        rows = join(h('<tr><td><span class="key {0}"></span> {1}</td><td class="n">{2}</td><td class="n">{3}</td>'
                      '<td class="n">{4}</td><td class="n">{5}</td><td class="n">{6}</td></tr>',
                      f"role-{role}", role, u.calls, u.failures, data.retries.get(role, 0),
                      u.prompt_tokens, u.completion_tokens) for role, u in usage.items())
        table = (h('<table class="usage"><thead><tr><th>role</th><th>calls</th><th>failed</th><th>retried</th>'
                   '<th>prompt tokens</th><th>completion tokens</th></tr></thead><tbody>{0}</tbody></table>', rows)
                 if usage else Safe('<p class="empty">No model calls recorded.</p>'))
        daily_calls = sum(c.calls for _, _, c in days)
        total_calls = sum(u.calls for u in usage.values())
        before = (h('<p class="meta">{0} calls were made before daily counts began (totals only).</p>',
                    total_calls - daily_calls) if total_calls > daily_calls else Safe(""))
        over_time = (h('<h3>Calls per day</h3>{0}<h3>Tokens per day</h3>{1}', usage_svg(days, "calls"),
                       usage_svg(days, "tokens")) if days else Safe('<p class="empty">No calls per day yet.</p>'))
        faults = (h("<p>Faults: {0}.</p>", ", ".join(f"{kind.replace('_', ' ')} {n}"
                                                      for kind, n in data.faults.items()))
                  if data.faults else Safe(""))
        alarm = rater_alarm(data)
        warning = h('<p class="error">Warning: {0}.</p>', alarm) if alarm is not None else Safe("")
        if data.resident is not None:  # (of every stream, whichever page: one process holds them)
            warning = join([warning, h('<p class="meta resident">In memory in the dashboard process: {0}.</p>',
                                       data.resident.text())])
        body = h('<h1>Stats{0}</h1>{1}{2}<h2>Importance</h2><p class="meta">Rated memories (observations and '
                 'reflections).</p>{9}{3}<h2>Model calls</h2>{4}{5}{10}<p class="legend">{6}</p>{7}{8}',
                 "" if stream is None else h(" of <code>{0}</code>", stream), counts, progress, histogram_svg(hist),
                 table, faults, join(h('<span class="key role-{0}"></span> {0} ', r)
                                     for r in ("rater", "reflector", "agent", "embedding")), over_time, before,
                 warning, _budget(data.budget))
        return self.layout("Stats" if stream is None else f"Stats of {stream}", body, stream=stream,
                           current="Stats")


def _spend(spent: int, limit: int | None) -> Safe:
    """A day's spend against its limit, with a meter (no limit: the spend alone)."""
    if limit is None:
        return h('{0} <span class="meta">(no limit)</span>', spent)
    return h('{0} / {1} <meter min="0" max="{1}" low="{2}" high="{3}" optimum="0" value="{4}">{5}%</meter>',
             spent, limit, limit * 0.75, limit * 0.9, min(spent, limit), min(100, spent * 100 // limit))


def _budget(budget: Sequence[RoleBudget]) -> Safe:
    """The day's spend against the daily budget (the whole persona's: every stream), when there is one."""
    if not budget:
        return Safe("")
    rows = join(h('<tr><td><span class="key role-{0}"></span> {0}</td><td>{1}</td><td>{2}</td><td>{3}</td></tr>',
                  b.role, _spend(b.calls, b.calls_per_day), _spend(b.tokens, b.tokens_per_day),
                  h('<span class="badge danger">spent until {0} UTC</span>', f"{b.renews_at:%Y-%m-%d %H:%M}")
                  if b.spent else "within budget") for b in budget)
    return h('<h3>Budget today</h3><p class="meta">{0} UTC, every stream of the persona; it renews at 00:00 UTC. '
             'A spent role makes no call: observations wait pending, replies are declined.</p>'
             '<table class="budget"><thead><tr><th>role</th><th>calls</th><th>tokens</th><th></th></tr></thead>'
             '<tbody>{1}</tbody></table>', f"{budget[0].day:%Y-%m-%d}", rows)


def _pager(path: str, stream: str, page: int, more: bool) -> Safe:
    return join([h('<a rel="next" href="{0}">older</a>', url(path, s=stream, page=page + 1)) if more else "",
                 h('<a rel="prev" href="{0}">newer</a>', url(path, s=stream, page=page - 1)) if page > 0 else ""],
                " ")


def _tree_items(node: EvidenceNode) -> Safe:
    """The evidence tree as nested lists (readable without script; the graph draws from the JSON)."""
    m = node.memory
    children = h('<ul>{0}</ul>', join(_tree_items(child) for child in node.evidence)) if node.evidence else Safe("")
    return h('<li><a href="/memory/{0}">#{0}</a> {1} {2} <span class="text">{3}</span>{4}</li>',
             m.id, _kind(m), _importance(m), m.text, children)
