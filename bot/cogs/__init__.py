"""The bot's cogs: one per concern."""
