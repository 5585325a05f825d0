"""Fixtures of the command line's tests: a fake model server answering as the persona would."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.openai_server import FakeOpenAIServer
from tests.memstream.cli.test_cli import _answer


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    """A fake OpenAI-compatible server that rates, reflects and answers (test_cli's `_answer`)."""
    async with FakeOpenAIServer() as running:
        running.on_chat(_answer)
        yield running
