"""How far the pipeline has read: the cut between the records its checkpoint and sinks have committed and the records
it has not read yet (a pipeline still running, or stopped midway). Shared by both checkers, which read the bounds
each with its own code (:mod:`streamproof.reconcile.cut` through the pipeline's checkpoint module,
:mod:`streamproof.reconcile.own_cut` as text) and judge with their own; the rules are stated here once.

* Per topic-partition, ``committed`` (C) is the end offset of the last committed batch (Spark's commit and offset
  logs; at-most-once, whose every start wipes Spark's logs: its progress file, marked before each write), and
  ``planned`` (P) the end of the last logged batch, at most one batch ahead. A partition an entry does not name is
  at 0. Both are read before the source, so that the source holds at least what they name.
* A record below C is judged as it always was: absent from where it belongs, it is lost.
* Past C, an invalid record was read when the quarantine table holds it.
* Past C, for a sink whose rows name their records (coordinates, no dedup, no windows), a valid record was read when
  the sink holds it: a sink may be a batch ahead of the commit log, or further ahead while the pipeline runs.
* For a sink of dedup keys or of each key's latest record (or of your code's rows), whose rows name only some of the
  records, the sink's position in a partition is past the last record it holds there (never below C): the records
  below it were read. No held row comes from a record past it, so nothing held is left unexplained; a record there
  the sink read and did not keep (a resend, an older update) counts as not yet read, not as a duplicate or
  superseded. Your code's totals name no record: read through C.
* Totals and windows name no record: the sink is at C, else at P, else at the source's end (a sink ahead of an
  older checkpoint, restored), whichever it reconciles at first; at C when it reconciles at none.
* Every other record is ``not_yet_read``: a term of its own (distinct coordinates), never lost, never unexpected;
  it does not change the verdict. A drained pipeline has C at the topic's end: nothing is cut.

No cut is made (every record is judged to the source's end, as before, and a loss found says why) for a source
whose positions are not offsets (files, Delta), for a checkpoint that cannot be read, and for an empty checkpoint
while a sink or the quarantine holds rows: what was read then cannot be told, and the verdict is ``unknown``.

Example::

    >>> cut = ReadThrough.of({"orders": {"0": 5000}}, {"orders": {"0": 10000}})
    >>> cut.committed_at("orders", 0), cut.planned_at("orders", 0), cut.planned_at("orders", 1)
    (5000, 10000, 0)
    >>> cut.to_json()
    {'orders': {'0': {'committed': 5000, 'planned': 10000}}}
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from streamproof.reconcile.counts import Check, Counts

Partition = tuple[str, int]
Ends = dict[str, dict[str, int]]  # end offsets as Spark logs them: {topic: {partition: offset}}

# Why no cut was made, for the report (``no_cut``); the verdict is as it always was unless said otherwise.
NOT_OFFSETS = (
    "a {kind} source's positions are not offsets per partition: every record is checked to the source's end; run "
    "the pipeline to its end before verifying"
)
EMPTY_WITH_ROWS = (
    "the checkpoint has no batch while {what} holds rows: what the pipeline read cannot be told (a lost "
    "or replaced checkpoint?), so every record is checked to the source's end"
)


@dataclass(frozen=True)
class ReadThrough:
    """The checkpoint's two bounds per topic-partition (``committed``, ``planned``), or why there is no cut."""

    committed: dict[Partition, int] = field(default_factory=dict)
    planned: dict[Partition, int] = field(default_factory=dict)
    planned_watermark_ms: int = 0  # the watermark the planned batch runs with: the windows it closes
    logged: bool = False  # the checkpoint planned a batch (at-most-once: its progress file exists)
    no_cut: str = ""  # why no cut is made: every record is judged to the source's end

    @classmethod
    def of(cls, committed: Ends | None, planned: Ends | None, planned_watermark_ms: int = 0) -> ReadThrough:
        """The bounds from the end offsets of the last committed and the last logged batch (None: no such batch)."""

        def flat(ends: Ends | None) -> dict[Partition, int]:
            return {(t, int(p)): int(o) for t, parts in (ends or {}).items() for p, o in parts.items()}

        return cls(flat(committed), flat(planned), planned_watermark_ms, committed is not None or planned is not None)

    def committed_at(self, topic: str, partition: int) -> int:
        return self.committed.get((topic, partition), 0)

    def planned_at(self, topic: str, partition: int) -> int:
        return max(self.planned.get((topic, partition), 0), self.committed_at(topic, partition))

    @property
    def ahead(self) -> bool:
        """Whether a batch is planned past the committed one (logged, not committed)."""
        return any(self.planned_at(*at) > self.committed_at(*at) for at in self.planned)

    def candidates(self) -> list[dict[Partition, int]]:
        """The positions a sink of totals or windows may be at: C, then P when a batch is planned past it."""
        planned = {at: self.planned_at(*at) for at in {*self.committed, *self.planned}}
        return [dict(self.committed), planned] if self.ahead else [dict(self.committed)]

    def to_json(self) -> dict[str, dict[str, dict[str, int]]]:
        """``read_through`` of the report: ``{topic: {partition: {"committed": C, "planned": P}}}``."""
        shown: dict[str, dict[str, dict[str, int]]] = {}
        for topic, partition in sorted({*self.committed, *self.planned}):
            bounds = {"committed": self.committed_at(topic, partition), "planned": self.planned_at(topic, partition)}
            shown.setdefault(topic, {})[str(partition)] = bounds
        return shown


@dataclass(frozen=True)
class Unread:
    """The source records set apart as not yet read: ``rows`` as read from the source, ``records`` distinct ones."""

    rows: int = 0
    records: int = 0


def how_cut(check: Check, dedup: bool, windows: bool) -> Literal["records", "position", "trial"]:
    """Which rule finds the records a sink's rows account for: ``records`` (each held record, by coordinates),
    ``position`` (past the last record the sink holds in a partition) or ``trial`` (C, else P: totals, windows).

    >>> how_cut(Check("records"), dedup=False, windows=False), how_cut(Check("latest", key="k"), False, False)
    ('records', 'position')
    """
    if windows or check.kind == "totals":
        return "trial"
    return "records" if check.kind == "records" and not dedup else "position"


def judged_cut(cut: ReadThrough, held_rows: bool, quarantine_rows: bool) -> tuple[ReadThrough, str]:
    """The cut one sink is judged by (``no_cut`` set: none) and why its counts cannot be trusted ("": they can).

    >>> judged_cut(ReadThrough(), held_rows=False, quarantine_rows=False)[0].no_cut
    ''
    >>> judged_cut(ReadThrough(), held_rows=True, quarantine_rows=False)[1][:40]
    'the checkpoint has no batch while the si'
    """
    if cut.no_cut or cut.logged or not (held_rows or quarantine_rows):
        return cut, ""
    why = EMPTY_WITH_ROWS.format(what="the sink" if held_rows else "the quarantine table")
    return replace(cut, no_cut=why), why


def with_unread(counts: Counts, unread: Unread) -> Counts:
    """The counts of the records read, with the ones not yet read: in the source's records, and as their own term
    (counted from their coordinates, so a record read twice past the cut still leaves a gap in the identity).

    >>> counts = Counts(source_records=3, expected=3, quarantined=0, upstream_duplicates=0, sink_records=3, lost=0,
    ...                 duplicated=0, unexpected=0)
    >>> with_unread(counts, Unread(rows=2, records=2)).source_records, with_unread(counts, Unread(2, 2)).not_yet_read
    (5, 2)
    """
    return replace(counts, source_records=counts.source_records + unread.rows, not_yet_read=unread.records)


def shown(cut: ReadThrough) -> dict[str, Any]:
    """The report's fields of a cut: ``read_through`` and, when no cut was made, why (``no_cut``)."""
    return {"read_through": cut.to_json(), "no_cut": cut.no_cut}
