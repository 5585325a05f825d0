"""Charts as inline SVG, drawn on the server: a stream's timeline, the importance histogram, a score's parts as
a stacked bar, model usage per day. Colours come from the stylesheet (classes), never from style attributes:
the Content-Security-Policy allows no inline style."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from memstream.config import StreamConfig
from memstream.records import Memory, RoleUsage, ScoredMemory
from memstream.web.html import Safe, h, join

__all__ = ["histogram_svg", "score_bar_svg", "timeline_svg", "usage_svg"]

ROLES = ("rater", "reflector", "agent", "embedding")
MAX_DAYS = 366  # the usage charts show the last year at most


def _short(text: str, width: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _role_class(role: str) -> str:
    return f"role-{role}" if role in ROLES else "role-other"


def timeline_svg(memories: Sequence[Memory], *, width: int = 960, height: int = 170) -> Safe:
    """Memories oldest first, one slot each (a burst stays readable): a bar as tall as the importance and
    coloured by it; a reflection in its own colour with a dot on top; a pending one a short grey stub."""
    if not memories:
        return Safe("")
    left, right, top, bottom = 28, 8, 14, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    slot = plot_w / len(memories)
    bar = max(1.0, min(14.0, slot * 0.8))
    parts = [h('<line class="axis" x1="{0}" y1="{1}" x2="{2}" y2="{1}"/>', left, top + plot_h, width - right)]
    for level in (1, 5, 10):
        y = top + plot_h - plot_h * level / 10
        parts.append(h('<text class="tick" x="{0}" y="{1}">{2}</text>', left - 6, f"{y + 4:.1f}", level))
    for i, m in enumerate(memories):
        level = m.importance or 1
        bar_h = plot_h * level / 10
        kind = ("pending" if m.status == "pending" else "reflection" if m.kind == "reflection"
                else f"imp{level}")
        x, y = left + i * slot + (slot - bar) / 2, top + plot_h - bar_h
        mark = (h('<circle class="mark" cx="{0}" cy="{1}" r="{2}"/>', f"{x + bar / 2:.1f}", f"{y - 5:.1f}",
                  f"{min(3.5, max(1.5, bar / 2)):.1f}") if m.kind == "reflection" else Safe(""))
        label = (f"#{m.id} {m.kind}, importance {m.importance if m.importance is not None else 'pending'}"
                 + (f", depth {m.depth}" if m.kind == "reflection" else "")
                 + f", {m.created_at:%Y-%m-%d %H:%M} UTC: {_short(m.text)}")
        parts.append(h('<a href="/memory/{0}" class="bar-link" data-id="{0}"><title>{1}</title>'
                       '<rect class="bar {2}" x="{3}" y="{4}" width="{5}" height="{6}"/>{7}</a>',
                       m.id, label, kind, f"{x:.1f}", f"{y:.1f}", f"{bar:.1f}", f"{bar_h:.1f}", mark))
    ticks = sorted({0, len(memories) // 2, len(memories) - 1})
    for n, i in enumerate(ticks):
        anchor = "start" if n == 0 else "end" if i == len(memories) - 1 else "middle"
        x = left if anchor == "start" else width - right if anchor == "end" else left + (i + 0.5) * slot
        parts.append(h('<text class="tick {0}" x="{1}" y="{2}">{3}</text>', anchor, f"{x:.1f}", height - 6,
                       f"{memories[i].created_at:%Y-%m-%d %H:%M}" + (" UTC" if anchor == "end" else "")))
    return h('<svg class="chart timeline" viewBox="0 0 {0} {1}" width="{0}" height="{1}" role="img" '
             'aria-label="timeline of {2} memories">{3}</svg>', width, height, len(memories), join(parts))


def histogram_svg(counts: Mapping[int, int], *, width: int = 480, height: int = 180) -> Safe:
    """One bar per importance 1..10 with its count."""
    left, top, bottom = 8, 16, 22
    plot_h = height - top - bottom
    top_count = max(counts.values(), default=0) or 1
    slot = (width - 2 * left) / 10
    parts = []
    for i in range(1, 11):
        n = counts.get(i, 0)
        bar_h = plot_h * n / top_count
        x = left + (i - 1) * slot
        parts.append(h('<g class="hbar"><title>importance {0}: {1} memories</title>'
                       '<rect class="bar imp{0}" x="{2}" y="{3}" width="{4}" height="{5}"/>'
                       '<text class="count" x="{6}" y="{7}">{1}</text>'
                       '<text class="tick" x="{6}" y="{8}">{0}</text></g>',
                       i, n, f"{x + 2:.1f}", f"{top + plot_h - bar_h:.1f}", f"{slot - 4:.1f}", f"{bar_h:.1f}",
                       f"{x + slot / 2:.1f}", f"{top + plot_h - bar_h - 3:.1f}", height - 6))
    return h('<svg class="chart histogram" viewBox="0 0 {0} {1}" width="{0}" height="{1}" role="img" '
             'aria-label="importance histogram">{2}</svg>', width, height, join(parts))


def score_bar_svg(item: ScoredMemory, config: StreamConfig, *, width: int = 240, height: int = 14) -> Safe:
    """A score's three weighted parts side by side; the full width is the highest score possible."""
    weights = (config.weight_recency, config.weight_importance, config.weight_relevance)
    total = sum(weights) or 1.0
    x = 0.0
    parts = []
    for name, weight, value in zip(("recency", "importance", "relevance"), weights,
                                   (item.recency, item.importance, item.relevance), strict=True):
        w = width * weight * value / total
        parts.append(h('<rect class="part {0}" x="{1}" y="0" width="{2}" height="{3}">'
                       '<title>{0}: {4} x weight {5} = {6}</title></rect>',
                       name, f"{x:.2f}", f"{w:.2f}", height, f"{value:.3f}", f"{weight:g}", f"{weight * value:.3f}"))
        x += w
    return h('<svg class="scorebar" viewBox="0 0 {0} {1}" width="{0}" height="{1}" role="img" '
             'aria-label="score {2}"><rect class="track" x="0" y="0" width="{0}" height="{1}"/>{3}</svg>',
             width, height, f"{item.score:.3f}", join(parts))


def usage_svg(days: Sequence[tuple[datetime, str, RoleUsage]], metric: str, *, width: int = 960,
              height: int = 170) -> Safe:
    """Per UTC day (the last year at most), a bar stacked by role: model calls (`metric="calls"`) or tokens
    (`"tokens"`)."""
    def value(counts: RoleUsage) -> int:
        return counts.calls if metric == "calls" else counts.prompt_tokens + counts.completion_tokens

    per_day: dict[datetime, dict[str, int]] = {}
    for day, role, counts in days:
        per_day.setdefault(day, {})[role] = per_day.get(day, {}).get(role, 0) + value(counts)
    if not per_day:
        return Safe("")
    left, right, top, bottom = 8, 8, 16, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    last = max(per_day)
    first = max(min(per_day), last - timedelta(days=MAX_DAYS - 1))
    ordered = [first + timedelta(days=n) for n in range((last - first).days + 1)]  # a day without calls shows
    peak = max(sum(per_day.get(day, {}).values()) for day in ordered) or 1
    slot = plot_w / len(ordered)
    bar = max(2.0, min(28.0, slot * 0.8))
    parts = []
    for i, day in enumerate(ordered):
        y = float(top + plot_h)
        x = left + i * slot + (slot - bar) / 2
        for role in sorted(per_day.get(day, {}), key=lambda r: (ROLES.index(r) if r in ROLES else len(ROLES), r)):
            n = per_day[day][role]
            bar_h = plot_h * n / peak
            y -= bar_h
            parts.append(h('<rect class="bar {0}" x="{1}" y="{2}" width="{3}" height="{4}">'
                           '<title>{5:}: {6} {7} {8}</title></rect>', _role_class(role), f"{x:.1f}", f"{y:.1f}",
                           f"{bar:.1f}", f"{bar_h:.1f}", f"{day:%Y-%m-%d}", role, n, metric))
    parts.append(h('<text class="tick start" x="{0}" y="{1}">{2}</text>', left, height - 6, f"{ordered[0]:%Y-%m-%d}"))
    if len(ordered) > 1:
        parts.append(h('<text class="tick end" x="{0}" y="{1}">{2}</text>', width - right, height - 6,
                       f"{ordered[-1]:%Y-%m-%d}"))
    parts.append(h('<text class="tick start" x="{0}" y="{1}">{2} {3} at most per day</text>', left, top - 4, peak,
                   metric))
    return h('<svg class="chart usage usage-{0}" viewBox="0 0 {1} {2}" width="{1}" height="{2}" role="img" '
             'aria-label="model {0} per day">{3}</svg>', metric, width, height, join(parts))
