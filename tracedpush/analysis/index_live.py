"""What the analysis index keeps between updates, so that a Live refresh costs time in
proportion to the new spans, not to the run (issue 12).

`AnalysisIndex` re-analyses only the traces that got spans (or whose clock offsets
moved), but the run-wide steps around that started from every kept trace in Python:
the clock offsets from every trace's causal pairs, the run's order, the load at each
request's start, every request's columns. At 200,000 requests that cost 2.5-3 s per
refresh, whatever arrived. `TraceSlots` keeps them between updates, by slot (a trace's
first-seen seq), written only for the traces an update touched:

* per-trace facts (root interval and resource, per-process spans) and per-request
  columns (`columns.SlotColumns`), from which the run's order (start, then first seen),
  load, load buckets and columns are numpy over the run;
* `SkewEvidence`: each trace's resources and causal pairs, aggregated per resource pair
  (lowest slack, pairs), a changed trace's old pairs taken out and its new ones put in
  (a trace's new pairs are no superset of its old ones: `skew.causal_pairs` takes the
  proxy's leg once it arrives, else the root). A resource pair whose lowest slack left
  with a trace's old pairs gets it again from the pair table. Mapping resource pairs to
  clock domains is then a handful of keys, and the edges equal `skew.collect`'s.

The slots are made from the kept facts when an index is opened. The skew evidence is
kept beside the index (`AnalysisIndex` writes it with the steps, for the facts as saved):
an index opened again takes it with the changed traces' evidence put in
(`kept_evidence`), on the first update that needs it (a warm report needs none). Made
from every kept trace's facts instead, it cost the first Live refresh after opening 0.6 s
at 200,000 requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from itertools import chain

import numpy as np

from tracedpush.analysis import skew
from tracedpush.analysis.columns import RunColumns, SlotColumns
from tracedpush.analysis.index_store import Kept, TraceFacts
from tracedpush.analysis.model import ClockOffset, OffsetWindow, Resource
from tracedpush.analysis.timeline import bucket_label, load_label

Key = tuple[int, int]  # (resource a, resource b) of a causal pair: a before b
# the arrays with one entry per slot, and what a slot not written holds
_PER_SLOT = {"kept": None, "tid": None, "root_res": -1, "root_iv": 0, "process": False,
             "request": False, "tpot": None, "engine": None}  # fmt: skip


class TraceSlots:
    """The kept traces by slot: facts, TPOT breakdowns and result columns as numpy
    arrays (see the module docstring). `touched` holds the slots written since the
    caller last cleared it."""

    def __init__(self, buckets: tuple[int, ...], load_buckets: tuple[int, ...]) -> None:
        self.buckets = buckets
        self.load_buckets = load_buckets
        self.n = 0  # one past the highest slot written
        self._rows = 0  # capacity
        self.kept = np.empty(0, dtype=object)  # each slot's `Kept` (None: not written)
        self.tid = np.empty(0, dtype=object)
        self.root_res = np.empty(0, dtype=np.int64)  # -1: no proxy root
        self.root_iv = np.empty((0, 2), dtype=np.int64)  # the root's raw (start, end)
        self.process = np.empty(0, dtype=bool)  # holds per-process spans
        self.request = np.empty(0, dtype=bool)  # a request of the run: a result row
        self.tpot = np.empty(0, dtype=object)  # TPOT breakdown
        self.engine = np.empty(0, dtype=object)  # decode engine id (`TraceFacts.engine`)
        self.columns = SlotColumns()
        self.touched: set[int] = set()
        self._skew: SkewEvidence | None = None  # made on first use
        # where the index keeps evidence for the facts as first written (`kept_evidence`)
        self._kept_skew: Callable[[], SkewEvidence | None] | None = None
        self._since: list[np.ndarray] = []  # slots written since then
        self._bucket_of: dict[int | None, str] = {}
        self._load_of: dict[int, str] = {}

    # ------------------------------------------------------------------ writing
    def put_facts(self, items: Sequence[tuple[str, Kept]]) -> None:
        """Write these traces' facts (new or changed); they are not requests of the run
        until `put_rows` (a changed trace's `Kept` has no result yet)."""
        if not items:
            return
        facts = [k.facts for _t, k in items]
        n = len(facts)
        at = np.fromiter((f.seq for f in facts), dtype=np.intp, count=n)
        self._fit(int(at.max()) + 1)
        self.kept[at] = np.fromiter((k for _t, k in items), dtype=object, count=n)
        self.tid[at] = np.fromiter((t for t, _k in items), dtype=object, count=n)
        # `_facts` sets a root's resource and interval together
        roots = (-1 if f.root_res is None else f.root_res for f in facts)
        self.root_res[at] = np.fromiter(roots, dtype=np.int64, count=n)
        ivs = chain.from_iterable(f.root_iv or (0, 0) for f in facts)
        self.root_iv[at] = np.fromiter(ivs, dtype=np.int64, count=2 * n).reshape(n, 2)
        self.process[at] = np.fromiter((f.process for f in facts), dtype=bool, count=n)
        self.engine[at] = np.fromiter((f.engine for f in facts), dtype=object, count=n)
        self.request[at] = False
        self.n = max(self.n, int(at.max()) + 1)
        self.touched.update(at.tolist())
        if self._skew is not None:
            self._skew.put(at, facts)
        elif self._kept_skew is not None:
            self._since.append(at)

    def put_rows(self, items: Sequence[tuple[str, Kept]]) -> None:
        """Write these traces' result rows: each with a row and request spans is a
        request of the run."""
        mine = [(t, k.facts.seq, k.row) for t, k in items if k.row is not None and k.facts.res]
        if not mine:
            return
        tids, at, rows = zip(*mine, strict=True)
        prompts = [row[2] for row in rows]
        for tokens in set(prompts) - self._bucket_of.keys():
            self._bucket_of[tokens] = bucket_label(tokens, self.buckets)
        buckets = list(map(self._bucket_of.__getitem__, prompts))
        self.columns.write(at, tids, rows, buckets)
        self.request[list(at)] = True
        self.touched.update(at)

    def put_tpot(self, kept: Sequence[Kept]) -> None:
        """Write these requests' TPOT breakdowns (after their rows)."""
        at = [k.facts.seq for k in kept]
        self.tpot[at] = np.fromiter((k.tpot for k in kept), dtype=object, count=len(kept))
        self.columns.write_breakdowns(at, [k.tpot for k in kept])
        self.touched.update(at)

    # ------------------------------------------------------------------ reading
    def traces(self) -> Iterator[tuple[str, Kept]]:
        """(trace id, `Kept`) of every slot, in first-seen order."""
        for tid, k in zip(self.tid[: self.n].tolist(), self.kept[: self.n].tolist(), strict=True):
            if k is not None:
                yield tid, k

    def at(self, slots: Sequence[int]) -> list[tuple[str, Kept]]:
        """(trace id, `Kept`) of these slots."""
        return list(zip(self.tid[slots].tolist(), self.kept[slots].tolist(), strict=True))

    def requests(self) -> list[tuple[str, Kept]]:
        """(trace id, `Kept`) of the run's requests, in first-seen order."""
        at = np.flatnonzero(self.request[: self.n])
        return list(zip(self.tid[at].tolist(), self.kept[at].tolist(), strict=True))

    def meeting(
        self, windows: Sequence[tuple[str, int, int]], off: Sequence[int], engines: Set[str]
    ) -> list[int]:
        """Slots of the requests whose decode window (on the reference clock, with the
        resources' ns offsets `off`) may meet one of `windows` (engine id, start, end)
        on that engine: a superset, by a millisecond, of those whose TPOT breakdown
        reads a step there. A request whose engine is not among the run's `engines`
        meets every engine's (it may be split over the only decode engine's steps)."""
        at = np.flatnonzero(self.request[: self.n] & (self.root_res[: self.n] >= 0))
        if not len(at) or not windows:
            return []
        origin = self.root_iv[at, 0] - np.asarray(off, np.int64)[self.root_res[at]]
        ttft, tpot, tokens = self.columns.decode_times(at)
        t0 = origin + ttft * 1e6
        t1 = t0 + tpot * (tokens - 1) * 1e6
        engine = self.engine[at]
        other = np.fromiter((e not in engines for e in engine.tolist()), bool, len(at))
        hit = np.zeros(len(at), bool)
        for eid, lo, hi in windows:
            on = other | (engine == eid)
            hit |= on & (t0 - 1e6 <= hi) & (t1 + 1e6 >= lo)  # NaN (no window) meets nothing
        return at[hit].tolist()

    def process_traces(self) -> list[str]:
        """The traces holding per-process spans, in first-seen order."""
        return self.tid[np.flatnonzero(self.process[: self.n])].tolist()

    def offsets(
        self, resources: Sequence[Resource], policy: str
    ) -> tuple[dict[str, ClockOffset], dict[int, str], list[OffsetWindow]]:
        """`analyze`'s clock offsets, exactly, each used resource's clock domain, and
        `analyze`'s offsets per stretch of the run (`skew.over_time`)."""
        n = self.n
        return self.evidence().offsets(self.root_res[:n], resources, policy, self.root_iv[:n, 0])

    def kept_evidence(self, load: Callable[[], SkewEvidence | None]) -> None:
        """`load` gives the skew evidence of the facts written so far (None: there is
        none kept for them); facts written from now on are put into it when it is used."""
        self._kept_skew, self._since = load, []

    @property
    def made_evidence(self) -> SkewEvidence | None:
        """The skew evidence if made (or taken from the index) yet, else None."""
        return self._skew

    def evidence(self) -> SkewEvidence:
        """The skew evidence of every trace: kept (`kept_evidence`) with the slots
        written since put in, else made from the kept facts, on first use."""
        if self._skew is None:
            load, self._kept_skew = self._kept_skew, None
            got = None if load is None else load()
            if got is not None:
                if self._since:
                    at = np.unique(np.concatenate(self._since))
                    got.put(at, [k.facts for k in self.kept[at].tolist()])
            else:
                facts = [k.facts for _t, k in self.traces()]
                at = np.fromiter((f.seq for f in facts), dtype=np.intp, count=len(facts))
                got = SkewEvidence(at, facts)
            self._skew, self._since = got, []
        return self._skew

    def run_columns(self) -> tuple[np.ndarray, RunColumns]:
        """The run's requests (their slots, in `analyze`'s order: by start, then first
        seen) and their columns, with the requests in flight at each root's start
        (`LoadCounter.at` over arrays) and its load bucket."""
        n = self.n
        req = np.flatnonzero(self.request[:n])
        order = req[np.argsort(self.columns.start(req), kind="stable")]
        roots = self.root_res[:n] >= 0
        starts = np.sort(self.root_iv[:n][roots, 0], kind="stable")  # timsort: nearly sorted
        ends = np.sort(self.root_iv[:n][roots, 1], kind="stable")
        rooted = roots[order]
        at = self.root_iv[order[rooted], 0]
        load = np.zeros(len(order), dtype=np.int64)
        load[rooted] = np.searchsorted(starts, at, "right") - np.searchsorted(ends, at, "right")
        cols = self.columns.take(order, load.tolist(), self._load_labels(load, rooted))
        return order, cols

    # ------------------------------------------------------------------ internals
    def _load_labels(self, load: np.ndarray, rooted: np.ndarray) -> list[str]:
        """`load_label` of each load ("unknown" without a proxy root), one call per
        distinct load (at most the run's concurrency)."""
        if not len(load):
            return []
        lo = int(load.min())
        names = np.empty(int(load.max()) - lo + 2, dtype=object)
        names[-1] = "unknown"
        for v in (np.flatnonzero(np.bincount(load - lo)) + lo).tolist():
            got = self._load_of.get(v)
            if got is None:
                got = self._load_of[v] = load_label(v, self.load_buckets)
            names[v - lo] = got
        ix = load - lo
        ix[~rooted] = len(names) - 1
        return names[ix].tolist()

    def _fit(self, rows: int) -> None:
        """Room for `rows` slots (doubling: appends cost amortised O(1) each)."""
        if rows > self._rows:
            self._rows = rows = max(rows, 2 * self._rows, 1024)
            for name, fill in _PER_SLOT.items():
                a = getattr(self, name)
                setattr(self, name, _grown(a, (rows, *a.shape[1:]), fill))


class SkewEvidence:
    """Every trace's clock-skew evidence by slot (its request spans' resources and
    causal pairs) and the pairs aggregated per resource pair: lowest slack and count
    (see the module docstring)."""

    def __init__(self, at: np.ndarray, facts: Sequence[TraceFacts]) -> None:
        self.n = 0  # one past the highest slot written
        self.res = np.full((0, 0), -1, dtype=np.int64)  # resources by slot; -1: none
        self.res_n = np.zeros((0, 0), dtype=np.int64)  # request spans on each
        self.pairs = np.full((0, 0, 3), -1, dtype=np.int64)  # (a, b, slack ns); a=-1: none
        self.low: dict[Key, int] = {}
        self.count: dict[Key, int] = {}
        self._write(at, facts)
        p = self.pairs[: self.n].reshape(-1, 3)
        p = p[p[:, 0] >= 0]
        if len(p):  # counts and lowest slacks per (a, b), as one number, with numpy
            r = int(p[:, :2].max()) + 1
            keys, which, count = np.unique(
                p[:, 0] * r + p[:, 1], return_inverse=True, return_counts=True
            )
            low = np.full(len(keys), np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(low, which, p[:, 2])
            for k, c, s in zip(keys.tolist(), count.tolist(), low.tolist(), strict=True):
                self.low[k // r, k % r], self.count[k // r, k % r] = s, c

    def __getstate__(self) -> dict:
        """Kept beside the index: the slots written, not the room grown for more."""
        n = self.n
        return {**self.__dict__, "res": self.res[:n], "res_n": self.res_n[:n],
                "pairs": self.pairs[:n]}  # fmt: skip

    def put(self, at: np.ndarray, facts: Sequence[TraceFacts]) -> None:
        """Replace these slots' evidence: their old pairs out of the aggregate, the new
        ones in. A resource pair whose lowest slack was among those taken out gets the
        lowest added if that is no higher, else its lowest from the pair table."""
        low, count = self.low, self.count
        old = self.pairs[at[at < len(self.pairs)]].reshape(-1, 3).tolist()
        self._write(at, facts)
        lost: dict[Key, int] = {}  # resource pair -> its lowest slack, now taken out
        for a, b, slack in old:
            if a < 0:
                continue
            left = count[a, b] - 1
            if not left:
                del count[a, b], low[a, b]
            else:
                count[a, b] = left
                if slack == low[a, b]:
                    lost.setdefault((a, b), slack)
        added: dict[Key, int] = {}
        for a, b, slack in chain.from_iterable(f.pairs for f in facts):
            count[a, b] = count.get((a, b), 0) + 1
            _lower(added, (a, b), slack)
            _lower(low, (a, b), slack)
        for (a, b), was in lost.items():
            if (a, b) in count and ((a, b) not in added or added[a, b] > was):
                p = self.pairs[: self.n]
                mine = (p[..., 0] == a) & (p[..., 1] == b)
                low[a, b] = int(p[..., 2][mine].min())

    def offsets(
        self, roots: np.ndarray, resources: Sequence[Resource], policy: str, starts: np.ndarray
    ) -> tuple[dict[str, ClockOffset], dict[int, str], list[OffsetWindow]]:
        """`analyze`'s clock offsets, exactly, each used resource's clock domain, and
        the offsets per stretch of the run; `roots`: each slot's root resource (-1:
        none), `starts`: its raw start (ns)."""
        res = self.res[: self.n].ravel()
        seen = _tally(res)
        used = sorted(seen, key=lambda r: seen[r][1])  # as first met, slot by slot
        dom = skew.domains([resources[i] for i in used])
        label = {i: dom[resources[i]] for i in used}
        rooted = np.flatnonzero(roots >= 0)
        if len(rooted):  # the proxy with the most of the first requests (`skew.REFERENCE_REQUESTS`)
            first = rooted[np.argsort(starts[rooted], kind="stable")[: skew.REFERENCE_REQUESTS]]
            ref = _most_common(_tally(roots[first]), label)  # ties: the first met in that order
        else:  # else the clock with the most spans
            ref = _most_common(_tally(res, self.res_n[: self.n].ravel()), label)
        if not ref:
            return {}, label, []
        windows = self.over_time(roots, starts, label, dom, ref, policy)
        offsets = skew.estimate_edges(self.edges(label), dom, ref, policy)
        return skew.settle(offsets, windows, dom, ref, policy), label, windows

    def over_time(
        self,
        roots: np.ndarray,
        starts: np.ndarray,
        label: dict[int, str],
        dom: Mapping[Resource, str],
        ref: str,
        policy: str,
    ) -> list[OffsetWindow]:
        """`skew.over_time` of the pairs of the slots with a proxy root, as `analyze`
        gives it (`skew.collect`'s ``timed``)."""
        n = min(self.n, len(roots))
        p = self.pairs[:n]
        slot = np.repeat(np.arange(n), p.shape[1])
        p = p.reshape(-1, 3)
        ok = (p[:, 0] >= 0) & (roots[slot] >= 0)
        p, slot = p[ok], slot[ok]
        names = sorted(set(label.values()))
        code = np.full(max(label, default=0) + 1, -1, dtype=np.int64)
        for r, x in label.items():
            code[r] = names.index(x)
        a, b = code[p[:, 0]], code[p[:, 1]]
        rooted = starts[: len(roots)][roots >= 0]
        return skew.over_time(starts[slot], a, b, p[:, 2], names, dom, ref, policy, rooted)

    def edges(self, label: dict[int, str]) -> skew.Edges:
        """`skew.collect`'s edges between clock domains, from the resource pairs."""
        w: dict[tuple[str, str], int] = {}
        n: dict[str, int] = {}
        for (a, b), c in self.count.items():
            da, db = label[a], label[b]
            if da == db:
                continue
            slack = self.low[a, b]
            if (da, db) not in w or slack < w[da, db]:
                w[da, db] = slack
            n[da] = n.get(da, 0) + c
            n[db] = n.get(db, 0) + c
        return skew.Edges(w, n)

    def _write(self, at: np.ndarray, facts: Sequence[TraceFacts]) -> None:
        if not len(at):
            return
        rows = int(at.max()) + 1
        width = max(len(f.res) for f in facts)
        self.res = _fitted(self.res, rows, width, -1)
        self.res_n = _fitted(self.res_n, rows, width, 0)
        self.pairs = _fitted(self.pairs, rows, max(len(f.pairs) for f in facts), -1)
        _put_ragged(self.res, at, [f.res for f in facts], -1)
        _put_ragged(self.res_n, at, [f.res_counts for f in facts], 0)
        _put_ragged(self.pairs, at, [f.pairs for f in facts], -1)
        self.n = max(self.n, rows)


def _lower(d: dict[Key, int], key: Key, value: int) -> None:
    """d[key] = value unless it holds a lower one."""
    if key not in d or value < d[key]:
        d[key] = value


def _grown(a: np.ndarray, shape: tuple[int, ...], fill: object) -> np.ndarray:
    """`a` in a larger array of `shape`, the rest `fill`."""
    out = np.full(shape, fill, dtype=a.dtype)
    out[tuple(slice(0, k) for k in a.shape)] = a
    return out


def _fitted(table: np.ndarray, rows: int, width: int, fill: int) -> np.ndarray:
    """`table` with room for `rows` rows (doubling) and `width` columns."""
    if rows <= len(table) and width <= table.shape[1]:
        return table
    rows = max(rows, 2 * len(table), 1024) if rows > len(table) else len(table)
    return _grown(table, (rows, max(width, table.shape[1]), *table.shape[2:]), fill)


def _put_ragged(
    table: np.ndarray, at: np.ndarray, rows: Sequence[Sequence[object]], fill: int
) -> None:
    """Set `table`'s rows `at` to `rows` (each of any length up to its width; of
    (a, b, slack) triples for a table of them), padded with `fill`, in one numpy write."""
    table[at] = fill
    lens = np.fromiter(map(len, rows), dtype=np.intp, count=len(rows))
    if not lens.any():
        return
    slot = np.repeat(at, lens)
    pos = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    flat: Iterable[object] = chain.from_iterable(rows)
    if table.ndim == 3:
        flat = chain.from_iterable(flat)  # type: ignore[arg-type]
    table[slot, pos] = np.fromiter(flat, dtype=np.int64).reshape(-1, *table.shape[2:])


def _tally(ids: np.ndarray, weights: np.ndarray | None = None) -> dict[int, tuple[int, int]]:
    """{id: (count, first position)} of the ids (>= 0) in `ids`, counted with `weights`."""
    ok = np.flatnonzero(ids >= 0)
    count = np.bincount(ids[ok], weights=None if weights is None else weights[ok])
    first = np.full(len(count), len(ids), dtype=np.intp)
    np.minimum.at(first, ids[ok], ok)
    present = np.flatnonzero(count).tolist()
    return {i: (int(count[i]), int(first[i])) for i in present}


def _most_common(tally: dict[int, tuple[int, int]], label: dict[int, str]) -> str:
    """The clock domain with the highest count, the first met among ties (as
    `Counter.most_common` over a run in first-seen order); "" for none."""
    count: dict[str, int] = {}
    first: dict[str, int] = {}
    for r, (c, at) in tally.items():
        x = label[r]
        count[x] = count.get(x, 0) + c
        first[x] = min(first.get(x, at), at)
    return min(count, key=lambda x: (-count[x], first[x]), default="")
