"""`memstream doctor`: one module per group of set-up checks, and the report that runs them."""

__all__: list[str] = []
