"""Ids given out in blocks per stream, so that a stream's rows sit together in a file that keeps rows in id order.

SQLite keeps a table's rows in id order. With one id sequence for the whole persona, a persona in many servers
writes each server's rows between the others': loading a 10k-memory stream then reads a page per row (the
bench's 10M-memory file: 10,006 rows on ~10k pages). Here each stream takes BLOCK consecutive ids at a time,
opened above every id given so far, so its rows fill neighbouring slots of the table (two 384-dimension rows
to a 4 KiB page) and its load walks a few dozen id ranges. Ids stay unique across the persona and are never
reused; within a stream they still follow its time. What a person sees is the stream's own numbering
(stream_numbers), never these ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["BLOCK", "Allocation", "allocate"]

BLOCK = 256

Block = tuple[int, int]  # (the stream's next id, one past its block's last id)


class Allocation:
    """The ids of a batch of new rows, the blocks they leave (to be stored) and the highest id now reserved."""

    __slots__ = ("blocks", "ids", "top")

    def __init__(self, ids: list[int], blocks: dict[str, Block], top: int) -> None:
        self.ids, self.blocks, self.top = ids, blocks, top


def allocate(streams: Sequence[str], held: Mapping[str, Block], top: int, block: int = BLOCK) -> Allocation:
    """Ids for new rows of `streams` (one per row, in order): each the next of its stream's block, a new block of
    `block` ids opened right above `top` (the highest id given or reserved) when the stream has none left.

    `held`: the streams' open blocks, as stored. The store keeps `top` at or above the end of every block it
    opened (reserving the block as it opens it) and passes only blocks none of whose ids was taken since.
    """
    if block < 1:
        raise ValueError(f"a block holds 1 id or more, got {block}")
    blocks = {s: held[s] for s in set(streams) if s in held}
    ids: list[int] = []
    for stream in streams:
        following, stop = blocks.get(stream, (0, 0))
        if not 0 < following < stop:
            following, stop = top + 1, top + 1 + block
            top = stop - 1
        ids.append(following)
        blocks[stream] = (following + 1, stop)
    return Allocation(ids, blocks, top)
