"""The Discord layer of memstream: a thin discord.py bot over the memstream core."""
