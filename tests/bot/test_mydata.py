"""/my-memories: the caller gets, only for their eyes, a file of what the persona remembers from their own
messages in that server, and nothing of anyone else's or of any other server or DM."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.bot.conftest import World, until
from tests.fakes.discord_server import SentMessage


async def _download(message: SentMessage) -> tuple[str, Any]:
    [attachment] = message.attachments
    async with aiohttp.ClientSession() as session, session.get(attachment["url"]) as response:
        assert response.status == 200
        return str(attachment["filename"]), json.loads(await response.read())


async def test_my_memories_sends_the_caller_their_own_memories_of_this_server_only(world: World) -> None:
    town = world.stream(world.town)
    first = await world.say(world.town, world.general, world.klaus, "KLAUSTOWN the recipe uses cardamom")
    await world.say(world.town, world.general, world.maria, "MARIATOWN I live at 12 Hidden Lane")
    await world.say(world.town, world.general, world.klaus, "KLAUSAGAIN see you at the party \x1b[2J")
    await world.say(world.other, world.lounge, world.klaus, "KLAUSELSEWHERE I bought paint brushes")
    dm = world.fake.dm_channel(world.klaus)
    await world.fake.send_message(dm, world.klaus, "KLAUSDM my cat is called Pixel")

    async def dm_stored() -> bool:
        return any("KLAUSDM" in m.text for m in await world.memory.recent(f"dm:{world.klaus.id}", 5))

    await until(dm_stored, "the DM to be stored")
    await world.drained()

    record = await world.fake.slash(world.town.id, world.general, world.klaus, "my-memories")
    [shown] = await record.wait_done()
    assert shown.ephemeral and "2 memory(ies)" in shown.content
    name, document = await _download(shown)
    assert name == f"my-memories-guild-{world.town.id}.json"
    assert document["persona"] == "Isabella Rodriguez" and document["author_id"] == str(world.klaus.id)
    assert document["stream"] == town and document["count"] == 2
    texts = [m["text"] for m in document["memories"]]
    assert texts == ["Klaus in #general: KLAUSTOWN the recipe uses cardamom",
                     "Klaus in #general: KLAUSAGAIN see you at the party \x1b[2J"]
    assert {m["stream"] for m in document["memories"]} == {town}
    assert document["memories"][0]["message_id"] == str(first["id"])
    assert document["memories"][0]["channel_id"] == str(world.general)
    everything = json.dumps(document)
    for other in ("MARIATOWN", "Hidden Lane", "KLAUSELSEWHERE", "KLAUSDM", "Pixel"):
        assert other not in everything

    # Someone the persona heard nothing from here gets no file, and no one else's memories.
    record = await world.fake.slash(world.other.id, world.lounge, world.maria, "my-memories")
    [shown] = await record.wait_done()
    assert shown.ephemeral and shown.attachments == []
    assert "I remember nothing from your messages here" in shown.content

    # The same command in the other server: only what Klaus said there.
    record = await world.fake.slash(world.other.id, world.lounge, world.klaus, "my-memories")
    [shown] = await record.wait_done()
    _, document = await _download(shown)
    assert [m["text"] for m in document["memories"]] == ["Klaus in #lounge: KLAUSELSEWHERE I bought paint brushes"]
    # Nothing was sent anywhere else: every message the bot created for these commands was ephemeral.
    assert all(m.ephemeral for m in world.fake.sent_messages if m.interaction_id is not None)
