"""Retrieval: every memory of a stream scored for a query, from in-memory indexes kept in step with the store.

    retriever.py   Retriever: embed the query, rank, read and touch the winners (RetrieverLike: its contract)
    ranking.py     rank: the stream's profile chooses how (spec.py, hybrid.py, or profiles.py's parts)
    spec.py        the paper's formula exactly, in two passes (exact.py: the passes and their Ranked answer)
    hybrid.py      the `hybrid` profile exactly: dense and lexical (lexical.py: BM25) relevance
    reference.py   rank_reference: the formula one memory at a time in plain Python, the test oracle
    profiles.py    the scoring profiles; grounding.py: how well each reflection rests on observations (hybrid)
    vector_index.py  VectorIndex: the loaded streams, kept in step by the store's events (the only writer)
    resident.py    Resident: the process's budget for them (least recently used streams dropped, reloaded)
    vectors.py     StreamVectors: one stream's float32 matrix and columns; screen.py: its int16 copy

Private numerics: _terms.py (pass 1's rules and the loops' bundles), _kernels.py (the compiled loops, loaded
on demand from _loops.py), _scan.py (pass 1 over the cores), _pages.py (huge pages).
"""

from memstream.index.exact import Ranked
from memstream.index.ranking import rank
from memstream.index.reference import rank_reference
from memstream.index.retriever import Retriever, RetrieverLike
from memstream.index.vector_index import VectorIndex
from memstream.index.vectors import StreamVectors

__all__ = ["Ranked", "Retriever", "RetrieverLike", "StreamVectors", "VectorIndex", "rank", "rank_reference"]
