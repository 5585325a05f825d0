"""The agent: fills the Agent prompt with who the persona is, the time, the situation and memories."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from datetime import datetime
from zoneinfo import ZoneInfo

from memstream.models.roles import Models
from memstream.prompts import load_prompt, one_line, tag_safe
from memstream.records import ScoredMemory

__all__ = ["Agent", "format_time"]


def format_time(moment: datetime, tz: ZoneInfo) -> str:
    """'Tuesday, February 13, 2024, 5:02 PM' in the persona's time zone."""
    local = moment.astimezone(tz)
    return f"{local:%A, %B} {local.day}, {local.year}, {local.hour % 12 or 12}:{local:%M %p}"


def _when(moment: datetime, tz: ZoneInfo) -> str:
    local = moment.astimezone(tz)
    return f"{local:%b} {local.day} {local.year}, {local.hour % 12 or 12}:{local:%M %p}"


class Agent:
    """Builds the agent prompt and asks the agent model what the persona does or says next."""

    def __init__(self, models: Models, *, name: str, summary: str, tz: ZoneInfo) -> None:
        self.models, self.name, self.summary, self.tz = models, name, summary, tz
        self.prompt = load_prompt("agent")

    def render(self, *, situation: str, memories: Sequence[ScoredMemory], at: datetime) -> str:
        """The filled Agent prompt; memories most relevant first, each on one line, tag-safe."""
        listing = "\n".join(
            f"- [{_when(item.memory.created_at, self.tz)}] {tag_safe(one_line(item.memory.text))}"
            for item in memories
        )
        return self.prompt.render(agent_name=self.name, agent_summary=self.summary,
                                  time=format_time(at, self.tz), situation=tag_safe(situation),
                                  retrieved_memories=listing)

    async def act(self, *, situation: str, memories: Sequence[ScoredMemory], at: datetime,
                  stream: str) -> tuple[str, str]:
        """The prompt and the model's reply."""
        prompt = self.render(situation=situation, memories=memories, at=at)
        reply = await self.models.complete("agent", prompt, stream=stream)
        return prompt, reply.strip()

    def speak(self, prompt: str, *, stream: str, streamed: bool = True) -> AsyncGenerator[str, None]:
        """The agent model's reply to a filled prompt, as it comes (in one piece unless `streamed`)."""
        return self.models.stream("agent", prompt, stream=stream) if streamed else self._whole(prompt, stream)

    async def _whole(self, prompt: str, stream: str) -> AsyncGenerator[str, None]:
        yield await self.models.complete("agent", prompt, stream=stream)
