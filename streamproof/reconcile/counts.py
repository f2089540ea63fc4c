"""What a reconciliation counts, and what state each sink is compared with: shared by both checkers.

The Spark checker (:mod:`streamproof.reconcile.checker`) and the independent one
(:mod:`streamproof.reconcile.independent`, no Spark) both answer in :class:`Counts`; neither imports the other.

Example::

    >>> check_for(PostgresSinkSpec(kind="postgres", table="t", mode="accumulate", by="c", sum=["amount"])).unit
    'groups'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from streamproof.config import COORDINATES, AnySinkSpec, DeltaSinkSpec, PostgresSinkSpec, PythonSinkSpec

VALID = "_valid"
DROPPED = "_dropped"  # a record that by configuration goes nowhere (a late record with dedup.late = "drop")
LATE_FLAG = "_late"
# A valid record of a batch the offset log no longer holds, older than the watermark of its first entry: whether it
# was late cannot be recomputed (the quarantine table says, or with dedup.late = "drop" nothing does).
MAYBE_LATE = "_maybe_late"
# The terms which records were late decides, per dedup.late: their basis is the late records' basis.
LATE_TERMS = {"quarantine": ("expected", "quarantined"), "drop": ("expected", "dropped_late")}
SAMPLES = 20  # named records per kind of damage: enough to go and look, few enough to read (Jepsen's set checker)


@dataclass
class Counts:
    """The checker's exact counts (:data:`streamproof.reconcile.report.Report` adds who and what was checked)."""

    source_records: int
    expected: int
    quarantined: int
    upstream_duplicates: int
    sink_records: int
    lost: int
    duplicated: int
    unexpected: int
    superseded: int = 0
    dropped_late: int = 0
    aggregated: int = 0
    pending: int = 0
    quarantine_lost: int = 0  # of ``lost``: invalid records missing from the quarantine table
    # Of ``duplicated``: groups holding the right record count with other sums (or a null sum): a wrong value, not an
    # increment applied twice, so no guarantee allows it. Counted in ``duplicated`` too, as DESIGN.md's report says.
    wrong_values: int = 0
    # Sink rows of records the source no longer holds (retention deleted them after they were read): not compared.
    unavailable: int = 0
    # Source records past what the checkpoint and the sink have committed (a pipeline running, or stopped midway:
    # streamproof.reconcile.read_through): a term of the identity, never lost, never unexpected.
    not_yet_read: int = 0
    # A pipeline with your own transform (streamproof.your_code.transform): expected/lost/duplicated count its rows
    # (or keys, groups), and ``transformed`` the valid records it was given: the identity's delivered term.
    your_code: bool = False
    transformed: int = 0
    # What was damaged, not only how many: up to SAMPLES rows each for "lost", "duplicated", "wrong_values" and
    # "unexpected" (each kind named as its count), each naming the record (coordinates), key, group or window, where
    # it was ("in") and what was found (a wrong value: the held and the expected values).
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """How a sink is compared with the source: the state it holds.

    * ``records``: one row per valid record, matched on source coordinates (or the dedup key);
    * ``latest``: one row per business ``key``, holding the key's latest record by ``order_by``;
    * ``totals``: one row per ``by`` group holding the sums of ``sums`` and the record count ``events``.
    """

    kind: Literal["records", "latest", "totals"]
    key: str | None = None
    order_by: str | None = None
    by: str | None = None
    sums: tuple[str, ...] = ()

    @property
    def unit(self) -> str:
        """What the report's expected / lost / duplicated count for this check."""
        return {"records": "records", "latest": "keys", "totals": "groups"}[self.kind]

    @property
    def columns(self) -> list[str]:
        """The source columns the check reads besides the coordinates."""
        return [c for c in (self.key, self.order_by, self.by, *self.sums) if c and c not in COORDINATES]


def source_gone(lows: dict[tuple[str, int], int], topic: str, partition: int, offset: int) -> bool:
    """Whether a coordinate is below its partition's first offset still held (``lows``: only partitions whose
    first offset is above 0): the record is gone from the source.

    >>> source_gone({("orders", 0): 100}, "orders", 0, 99), source_gone({("orders", 0): 100}, "orders", 1, 5)
    (True, False)
    """
    low = lows.get((topic, partition))
    return low is not None and offset < low


def unverifiable_without(lows: dict[tuple[str, int], int], check: Check, dedup: bool, windows: bool) -> str:
    """Why a sink cannot be checked while the source lacks its first records ("" when it can): only a sink of
    records matched on their coordinates can set the gone ones aside; a key's latest record, a group's total, a
    window or a dedup key's first record may have come from a record that is gone.

    >>> unverifiable_without({}, Check("latest", key="k", order_by="t"), False, False)
    ''
    """
    if not lows or (check.kind == "records" and not dedup and not windows):
        return ""
    gone = ", ".join(f"{topic}:{partition} below offset {low:,}" for (topic, partition), low in sorted(lows.items()))
    return (
        f"the source no longer holds its first records ({gone}: retention deleted them), so what this sink holds "
        "cannot be recomputed"
    )


def unverifiable_maybe_late(maybe_late: int, first_logged: int) -> str:
    """Why a sink whose rows do not name their records (a key's latest state, totals, windows) cannot be checked when
    ``maybe_late`` records of the batches before the offset log's first entry may have been dropped as late.

    >>> unverifiable_maybe_late(12, 20)[:40]
    '12 records of batches 0-20 may have been'
    """
    return (
        f'{maybe_late:,} records of batches 0-{first_logged} may have been dropped as late (dedup.late = "drop" '
        f"keeps no record of what it dropped, and the checkpoint's offset log starts at batch {first_logged}), "
        "and what this sink holds depends on which were: it cannot be recomputed"
    )


def check_for(sink: AnySinkSpec) -> Check:
    """The state a sink holds, from its settings.

    >>> check_for(DeltaSinkSpec(kind="delta", path="t", mode="merge", key="order_id"))
    Check(kind='latest', key='order_id', order_by='event_time', by=None, sums=())
    """
    if isinstance(sink, DeltaSinkSpec) and sink.mode == "merge":
        return Check("latest", key=sink.key, order_by=sink.order_by)
    if isinstance(sink, PostgresSinkSpec) and sink.mode == "upsert":
        return Check("latest", key=sink.key, order_by=sink.order_by)
    if isinstance(sink, PythonSinkSpec) and sink.key:
        return Check("latest", key=sink.key, order_by=sink.order_by)
    if isinstance(sink, PostgresSinkSpec) and sink.mode == "accumulate":
        return Check("totals", by=sink.by, sums=tuple(sink.sum))
    return Check("records")
