"""How well each memory is grounded in what happened: the `hybrid` profile's guard against runaway reflection.

The spec's failure mode: reflections about reflections drift away from what happened; "keep evidence pointers
and weight insights by the observations they cite". The rule:

    grounding(observation) = 1
    grounding(reflection)  = the mean, over the memories it cites (in citation order), of
                             1 for an observation, HALF * grounding(r) for a reflection r
                             (0 for a reflection that cites nothing)

It is the share of the reflection's evidence tree that ends in observations (each citation of a reflection
shares its part evenly among what it cites), where each reflection passed on the way halves that share. An
insight drawn from observations only is fully grounded (1, like an observation); one drawn from such insights
only is 0.5, one level further 0.25; an insight citing two observations and two first-level insights is 0.75.

`hybrid` subtracts `grounding_weight * (1 - grounding)` from a memory's score (profiles.py): what happened
scores as before, and a reflection on reflections must be that much more relevant to win a place.

A reflection's grounding cannot change while it exists: the store deletes every reflection that cites a
forgotten or edited memory, transitively, in the deletion's transaction. So the value is computed once, when
the reflection is saved (the store's EvidenceSaved event) or its stream is loaded (Store.evidence_links), and
dropped with the memory (MemoriesRemoved).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from memstream.store.arrays import F64, I64

__all__ = ["HALF", "Grounding", "grounding_reference"]

HALF = 0.5  # what each reflection between an insight and the observations under it keeps of their share


def _mean(cited: Sequence[int], value: Mapping[int, float]) -> float:
    """The rule for one reflection, given the grounding of the reflections it cites (`value`; others are
    observations). Sums left to right: the reference below makes the very same operations."""
    if not cited:
        return 0.0
    total = 0.0
    for memory_id in cited:
        total += HALF * value[memory_id] if memory_id in value else 1.0
    return total / len(cited)


def grounding_reference(evidence: Mapping[int, Sequence[int]]) -> dict[int, float]:
    """The rule from scratch, one reflection at a time (the test oracle): `evidence` maps every reflection of a
    stream to the memories it cites; memories not in it are observations. Returns every reflection's value."""
    done: dict[int, float] = {}

    def of(memory_id: int) -> float:
        if memory_id not in done:
            total = 0.0
            cited = evidence[memory_id]
            for c in cited:
                total += HALF * of(c) if c in evidence else 1.0
            done[memory_id] = total / len(cited) if cited else 0.0
        return done[memory_id]

    for reflection in evidence:
        of(reflection)
    return done


class Grounding:
    """The grounding of every reflection of one loaded stream (observations are 1 and not kept).

    Kept in step by the store's events through VectorIndex; `version` moves with every change, so that a
    per-row column derived from it (StreamVectors.memo) is made again."""

    def __init__(self, evidence: Mapping[int, Sequence[int]] | None = None) -> None:
        self.value: dict[int, float] = {}
        self.version = 0
        if evidence:
            self._build(evidence)

    def _build(self, evidence: Mapping[int, Sequence[int]]) -> None:
        """Every reflection, those it cites first (a reflection only cites memories older than itself)."""
        state: dict[int, int] = {}  # 1: being computed, 2: done
        for start in evidence:
            stack = [start]
            while stack:
                memory_id = stack[-1]
                if state.get(memory_id) == 2:
                    stack.pop()
                    continue
                state[memory_id] = 1
                waiting = [c for c in evidence[memory_id] if c in evidence and state.get(c) is None]
                if waiting:
                    stack.extend(waiting)
                    continue
                self.value[memory_id] = _mean(evidence[memory_id], self.value)
                state[memory_id] = 2
                stack.pop()
        self.version += 1

    def add(self, reflections: Iterable[tuple[int, Sequence[int]]]) -> None:
        """Reflections just saved, each with what it cites (in citation order)."""
        for memory_id, cited in reflections:
            self.value[int(memory_id)] = _mean([int(c) for c in cited], self.value)
        self.version += 1

    def discard(self, ids: Iterable[int]) -> None:
        """Memories gone (a reflection citing one of them is gone too: the store's cascade)."""
        for memory_id in ids:
            self.value.pop(int(memory_id), None)
        self.version += 1

    def column(self, ids: I64) -> F64:
        """Every row's grounding, row by row (`ids`: the rows' memory ids)."""
        out = np.ones(ids.size, np.float64)
        if self.value:
            known = np.fromiter(self.value, np.int64, len(self.value))
            rows = np.flatnonzero(np.isin(ids, known))
            out[rows] = [self.value[i] for i in ids[rows].tolist()]
        return out
