"""/my-memories: a person's own data-access request, answered by the persona itself."""

from __future__ import annotations

import gzip
import io

import discord
from discord import app_commands
from discord.ext import commands

from bot.bot import PersonaBot, stream_key
from memstream.data.export import author_document, document_text

__all__ = ["MyDataCog", "setup"]

Interaction = discord.Interaction[discord.Client]


class MyDataCog(commands.Cog):
    """The caller's own memories of this server (or this DM), never anyone else's, sent only to them."""

    def __init__(self, bot: PersonaBot) -> None:
        self.bot = bot

    @app_commands.command(name="my-memories")
    async def my_memories(self, interaction: Interaction) -> None:
        """Get a file of everything I remember from your messages in this server (only you see it)."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        stream = stream_key(interaction.guild_id, interaction.user.id)
        author = str(interaction.user.id)
        document = author_document(await self.bot.memory.author_memories(author, stream=stream),
                                   persona=self.bot.persona.name, author_id=author, at=self.bot.memory.now(),
                                   stream=stream)
        where = "here" if interaction.guild_id is not None else "in our direct messages"
        if not document["count"]:
            await interaction.followup.send(f"I remember nothing from your messages {where}.", ephemeral=True)
            return
        data, name = document_text(document).encode("utf-8"), f"my-memories-{stream.replace(':', '-')}.json"
        if len(data) > interaction.filesize_limit:
            data, name = gzip.compress(data), name + ".gz"
        if len(data) > interaction.filesize_limit:
            await interaction.followup.send(
                f"I remember {document['count']} message(s) of yours {where}: too many for one file on Discord. "
                "Ask the bot's operator for a copy (`memstream export --author` with your user id).", ephemeral=True)
            return
        forget = " `/forget` makes me forget them." if interaction.guild_id is not None else ""
        await interaction.followup.send(
            f"Everything I remember from your messages {where}: {document['count']} memory(ies).{forget}",
            file=discord.File(io.BytesIO(data), filename=name), ephemeral=True)


async def setup(bot: commands.Bot) -> None:
    """Load the cog."""
    assert isinstance(bot, PersonaBot)
    await bot.add_cog(MyDataCog(bot))
