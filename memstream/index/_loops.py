"""The compiled loops of _kernels.py (numba): imported only when first needed.

Module-level functions, so that numba's on-disk cache finds them again in the next process. Arrays and scalars
that travel together come in as one bundle (_terms.py's namedtuples).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils
from numba.extending import intrinsic

from memstream.index._terms import U64, Scales, importance_terms, recency_terms, relevance_terms

__all__ = ["bm25", "candidates", "context", "cosines", "cut", "finish", "pass_terms", "prepare", "quantize"]

jit = numba.njit(cache=True, nogil=True, error_model="numpy")
# The product alone may sum in any order and fuse multiply-adds: its error bound (screen.cosine_error) holds
# for every order, with or without FMA. Nothing else here may.
product = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
rec_terms, imp_terms, rel_terms = jit(recency_terms), jit(importance_terms), jit(relevance_terms)
# How many rows ahead `cosines` asks for the screen's codes (prefetch): measured on this VM at 1M x 384 over
# two cores, 51.8 ms without, 30.4 with 8 rows ahead, 30.6 with 16, 33.8 with 32; at 100k 3.4, 2.7, 1.9, 2.0.
# Over float32 rows it made the pass slower (55.0 ms without, 58.6-65.2 with): none there.
_AHEAD = 16


@intrinsic
def _prefetch(typingctx: Any, matrix: Any, row: Any, column: Any) -> Any:
    """Asks the CPU to bring the cache line of matrix[row, column] in: a hint, never a fault."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        kind = signature.args[0]
        array = context.make_array(kind)(context, builder, args[0])
        where = cgutils.get_item_pointer(context, builder, kind, array, [args[1], args[2]])  # type: ignore[no-untyped-call]
        byte, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        llvm = builder.module.declare_intrinsic("llvm.prefetch",
                                                fnty=ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]))
        # a read (0), to keep in every cache level (3), of data (1)
        builder.call(llvm, [builder.bitcast(where, byte), ir.Constant(i32, 0), ir.Constant(i32, 3),
                            ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return numba.types.void(matrix, row, column), codegen


@jit
def prepare(query: Any) -> tuple[Any, float, Any]:
    # The query in float64, its reference norm (squares summed first to last) and the float32 unit
    # query of the product.
    q64 = np.empty(query.size, np.float64)
    squares = 0.0
    for d in range(query.size):
        x = np.float64(query[d])
        q64[d] = x
        squares += x * x
    norm = math.sqrt(squares)
    unit = np.zeros(query.size, np.float32)
    if norm != 0.0:
        for d in range(query.size):
            unit[d] = np.float32(q64[d] / norm)
    return q64, norm, unit

@product
def cosines(matrix: Any, unit: Any, inverse_norms: Any, out: Any, start: int) -> tuple[float, float, bool]:
    # Row r of this block is row start + r of the stream: out[start + r] = (matrix[r] . unit) * its inverse
    # norm, in float32 (as np.matmul then np.multiply); returns the smallest and largest and whether any is NaN.
    # The matrix is float32 rows, or a screen's int16 codes (screen.py) with their factors as `inverse_norms`:
    # a code is exact in float32.
    m, dim = matrix.shape
    low = np.float32(np.inf)
    high = np.float32(-np.inf)
    nan = False
    ahead = _AHEAD if matrix.itemsize == 2 else 0
    per_line = 64 // matrix.itemsize
    r = 0
    while r < m:
        step = 4 if r + 4 <= m else 1  # four rows at a time (four independent sums in flight), then one
        if ahead and r + step + ahead <= m:
            for j in range(r + ahead, r + step + ahead):
                for d in range(0, dim, per_line):
                    _prefetch(matrix, j, d)  # type: ignore[call-arg]
        a0 = a1 = a2 = a3 = np.float32(0.0)
        if step == 4:
            for d in range(dim):
                u = unit[d]
                a0 += np.float32(matrix[r, d]) * u
                a1 += np.float32(matrix[r + 1, d]) * u
                a2 += np.float32(matrix[r + 2, d]) * u
                a3 += np.float32(matrix[r + 3, d]) * u
        else:
            for d in range(dim):
                a0 += np.float32(matrix[r, d]) * unit[d]
        for j in range(step):
            a = a0 if j == 0 else (a1 if j == 1 else (a2 if j == 2 else a3))
            c = a * inverse_norms[start + r + j]
            out[start + r + j] = c
            if c != c:
                nan = True
            elif c < low:
                low = c
            if c > high:
                high = c
        r += step
    return float(low), float(high), nan

@jit
def quantize(matrix: Any, codes: Any, factors: Any, start: int) -> float:
    # Each row of `matrix` as int16 codes (screen.py): scale = its largest |component| / 32767, codes[r] =
    # round(row / scale), factors[start + r] = scale / |row| in float32 (0 for a zero row, NaN for a row that
    # is not finite). Returns the largest |row - scale * codes| / |row| (in float64, off by a few ulps at most).
    m, dim = matrix.shape
    worst = 0.0
    for r in range(m):
        top = 0.0
        for d in range(dim):
            top = max(top, abs(np.float64(matrix[r, d])))
        scale = top / 32767.0
        squares = 0.0
        misses = 0.0
        for d in range(dim):
            x = np.float64(matrix[r, d])
            c = 0.0
            if scale > 0.0 and math.isfinite(scale):
                c = min(max(np.floor(x / scale + 0.5), -32767.0), 32767.0)
            codes[r, d] = np.int16(c)
            squares += x * x
            miss = x - c * scale
            misses += miss * miss
        norm = math.sqrt(squares)
        if not math.isfinite(norm) or not math.isfinite(scale):
            factors[start + r] = np.nan
        elif norm == 0.0:
            factors[start + r] = 0.0
        else:
            factors[start + r] = np.float32(scale / norm)
            worst = max(worst, math.sqrt(misses) / norm)
    return worst

@jit
def bm25(out: Any, slots: Any, tfs: Any, slot_row: Any, slot_len: Any, idf: float, avg: float, k1: float,
         b: float) -> None:
    # One query term's BM25 added to each row holding it (lexical.StreamTerms.score): the operations of
    # lexical.bm25_reference, in its order.
    for j in range(slots.size):
        row = slot_row[slots[j]]
        if row >= 0:
            tf = np.float64(tfs[j])
            length = np.float64(slot_len[slots[j]])
            out[row] += idf * (tf * (k1 + 1.0)) / (tf + k1 * (1.0 - b + b * (length / avg)))

@jit
def context(cos: Any, low: float, spread: float, share: float, lexical: Any, inv_top: float, lex_scale: float,
            prev: Any, nxt: Any, parent: Any, boost: Any, neighbour: float, weight: float, out: Any) -> None:
    # Pass 1's keyword and context terms of every row (hybrid.rank_hybrid, levers.py), approximate like the rest
    # of pass 1: lexical * lex_scale + weight * (neighbour * max(rel0 of the neighbours, 0) + boost), where
    # rel0 = (1 - share) * (cos - low) / spread + share * lexical / top.
    for i in range(cos.size):
        best = 0.0
        if neighbour != 0.0:
            for j in (prev[i], nxt[i], parent[i]):
                if j >= 0:
                    rel0 = (1.0 - share) * ((np.float64(cos[j]) - low) / spread) + share * (lexical[j] * inv_top)
                    best = max(best, rel0)
        out[i] = lexical[i] * lex_scale + weight * (neighbour * best + boost[i])


@jit
def score(i: int, y: Any, importance: Any, c: float, scales: Scales) -> float:
    # Pass 1's score of a row, term by term as the numpy path computes it.
    s = 0.0
    if scales.rec_scale != 0.0:
        s = min(y[i], scales.y_cap) * scales.rec_scale
    if scales.imp_scale != 0.0:
        s = s + importance[i] * scales.imp_scale
    if scales.cos_scale != 0.0:
        s = s + c * scales.cos_scale
    return s

@jit
def pass_terms(lo: float, hi: float, nan: bool, t0: float, scoring: Any, dim_error: float) -> Scales:
    # Pass 1's scales from the float32 cosines' range (lo, hi; nan: whether any is NaN), the query's Scoring
    # and t0 of the stream's recency proxy.
    error = dim_error if (math.isfinite(lo + hi) and not nan) else np.inf
    w_rec, w_imp, w_rel = scoring.w_rec, scoring.w_imp, scoring.w_rel
    rec_scale, y_cap, slack, magnitude = rec_terms(w_rec, scoring.decay, scoring.last_low, scoring.last_high,
                                                   scoring.now, t0)
    imp_scale, imp_magnitude = imp_terms(w_imp, scoring.imp_low, scoring.imp_high)
    cos_scale, slack = rel_terms(lo, hi, error, w_rel, slack, magnitude + imp_magnitude, w_rec + w_imp + w_rel)
    cut_low, cut_high = (lo + 2 * error, hi - 2 * error) if math.isfinite(error) else (np.inf, -np.inf)
    return Scales(rec_scale, y_cap, imp_scale, cos_scale, 2 * slack, cut_low, cut_high)

@jit
def candidates(dots: Any, start: int, end: int, y: Any, importance: Any, scales: Any, best: Any, rows: Any,
               extremes: Any) -> tuple[int, int]:
    # Rows start..end-1 of pass 1: each row's approximate score, kept only as far as needed: into `rows`,
    # the rows within `scales.gap` of the k-th best score so far (`best`, ascending, updated: its size is k);
    # into `extremes`, the rows that can hold the smallest or largest cosine. Returns how many of each (more
    # than the room given: they did not all fit).
    rec_scale, y_cap, imp_scale, cos_scale, gap, cut_low, cut_high = scales
    count = 0
    ext = 0
    floor = best[0] - gap  # rows scoring below it cannot be among the k best
    for i in range(start, end):
        c = dots[i]
        s = 0.0
        if rec_scale != 0.0:
            yi = y[i]
            s = (yi if yi < y_cap else y_cap) * rec_scale
        if imp_scale != 0.0:
            s = s + importance[i] * imp_scale
        if cos_scale != 0.0:
            s = s + np.float64(c) * cos_scale
        if not (s < floor):
            if s > best[0]:
                j = 0
                while j + 1 < best.size and best[j + 1] < s:
                    best[j] = best[j + 1]
                    j += 1
                best[j] = s
                floor = best[0] - gap  # best[0] only grows: the rows kept are a superset of the final cut
            if count < rows.size:
                rows[count] = i
            count += 1
        if not (c > cut_low and c < cut_high):  # (a NaN too)
            if ext < extremes.size:
                extremes[ext] = i
            ext += 1
    return count, ext

@jit
def cut(dots: Any, rows: Any, y: Any, importance: Any, scales: Any, floor: float) -> int:
    # Keeps, in place and in order, the rows whose score is not below `floor`; returns how many.
    kept = 0
    for j in range(rows.size):
        i = rows[j]
        if not (score(i, y, importance, np.float64(dots[i]), scales) < floor):
            rows[kept] = i
            kept += 1
    return kept

@jit
def exact_rows(matrix: Any, query: Any, q_norm: float) -> Any:
    # The reference's cosine of each row: float64 products summed first to last.
    m, dim = matrix.shape
    out = np.zeros(m, np.float64)
    if q_norm == 0.0:
        return out
    for r in range(m):
        dot = 0.0
        squares = 0.0
        for d in range(dim):  # two sums, each first to last
            x = np.float64(matrix[r, d])
            dot += x * query[d]
            squares += x * x
        norm = math.sqrt(squares)
        if norm != 0.0:
            out[r] = dot / (norm * q_norm)
    return out

@jit
def recency(decay: float, now: float, at: float) -> Any:
    return decay ** (max(now - at, 0.0) / 3600.0)  # the reference's expression

@jit
def recency_range(decay: float, now: float, last: Any, low: float, high: float) -> tuple[float, float]:
    # The reference's min and max recency (exact.pow_range, the same rule).
    if decay == 1.0:
        return 1.0, 1.0
    window = 8 * 2 * U64 * 3600.0 / -math.log(decay)
    top = max(abs(low), abs(high))
    if window < np.nextafter(top, np.inf) - top:
        return recency(decay, now, low), recency(decay, now, high)
    r_low, r_high = np.inf, -np.inf
    for at in last:
        if at <= low + window:
            r_low = min(r_low, recency(decay, now, at))
        if at >= high - window:
            r_high = max(r_high, recency(decay, now, at))
    return r_low, r_high

@jit
def scaled(value: float, low: float, high: float) -> float:
    return 0.5 if high - low <= 0.0 else (value - low) / (high - low)

@jit
def finish(matrix: Any, offset: int, rows: Any, extremes: Any, query: Any, q_norm: float, columns: Any,
           scoring: Any, k: int) -> tuple[Any, Any]:
    # Pass 2: the reference's cosine of the candidates `rows` and of the rows that can hold the stream's
    # extreme cosines (rows of the stream: matrix[row - offset], or if offset < 0, matrix holds them
    # gathered, candidates first), the reference's normalized parts and score of each candidate (from the
    # stream's Columns and the query's Scoring), and the k best by its rule (score, then the newer memory,
    # then the higher id).
    last, importance, created, ids = columns
    now, decay, w_rec, w_imp, w_rel, last_low, last_high, imp_low, imp_high = scoring
    count = rows.size
    if offset < 0:
        cos = exact_rows(matrix, query, q_norm)
    else:
        cos = exact_rows(matrix[np.concatenate((rows, extremes)) - offset], query, q_norm)
    c_low, c_high = np.inf, -np.inf
    for c in cos:
        c_low = min(c_low, c)
        c_high = max(c_high, c)
    r_low, r_high = recency_range(decay, now, last, last_low, last_high)
    parts = np.empty((5, count))
    for j in range(count):
        row = rows[j]
        rec = scaled(recency(decay, now, last[row]), r_low, r_high)
        imp = scaled(importance[row], imp_low, imp_high)
        rel = scaled(cos[j], c_low, c_high)
        parts[0, j] = w_rec * rec + w_imp * imp + w_rel * rel
        parts[1, j] = rec
        parts[2, j] = imp
        parts[3, j] = rel
        parts[4, j] = cos[j]
    take = min(k, count)
    order = np.arange(count)
    for i in range(take):  # selection of the k best, in order
        best = i
        for j in range(i + 1, count):
            a, b = order[j], order[best]
            sa, sb = parts[0, a], parts[0, b]
            ta, tb = created[rows[a]], created[rows[b]]
            if sa > sb or (sa == sb and (ta > tb or (ta == tb and ids[rows[a]] > ids[rows[b]]))):
                best = j
        order[i], order[best] = order[best], order[i]
    top = order[:take]
    return rows[top].copy(), np.ascontiguousarray(parts[:, top])
