"""Moving memories in and out: import readers, export, copy, backup and salvage, eval replay."""

__all__: list[str] = []
