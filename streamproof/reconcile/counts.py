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

from streamproof.config import COORDINATES, AnySinkSpec, DeltaSinkSpec, PostgresSinkSpec

VALID = "_valid"
DROPPED = "_dropped"  # a record that by configuration goes nowhere (a late record with dedup.late = "drop")
LATE_FLAG = "_late"
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
    # What was damaged, not only how many: up to SAMPLES rows each for "lost", "duplicated" and "unexpected",
    # each naming the record (coordinates), key, group or window, where it was ("in") and what was found.
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


def check_for(sink: AnySinkSpec) -> Check:
    """The state a sink holds, from its settings.

    >>> check_for(DeltaSinkSpec(kind="delta", path="t", mode="merge", key="order_id"))
    Check(kind='latest', key='order_id', order_by='event_time', by=None, sums=())
    """
    if isinstance(sink, DeltaSinkSpec) and sink.mode == "merge":
        return Check("latest", key=sink.key, order_by=sink.order_by)
    if isinstance(sink, PostgresSinkSpec) and sink.mode == "upsert":
        return Check("latest", key=sink.key, order_by=sink.order_by)
    if isinstance(sink, PostgresSinkSpec) and sink.mode == "accumulate":
        return Check("totals", by=sink.by, sums=tuple(sink.sum))
    return Check("records")
