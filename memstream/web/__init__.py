"""The memory dashboard (`memstream web`): a persona's streams, timeline, search ranking, evidence graphs and
stats in the browser, served by aiohttp on localhost. Read-only unless started with --allow-forget."""

from __future__ import annotations

from memstream.web.app import WebOptions, make_app
from memstream.web.security import resolve_token
from memstream.web.serve import serve

__all__ = ["WebOptions", "make_app", "resolve_token", "serve"]
