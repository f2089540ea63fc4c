"""What each cell of the proof matrix must show, and what it showed (:class:`MatrixCell`): the damage a guarantee
allows at a crash point, in the sink the crash hit or in the sinks around it; and, for your own sink, the guarantee
its code gave (:func:`guarantee_given`). Pure: :mod:`streamproof.harness.matrix` runs the cells.

Example::

    >>> expected_damage("at-least-once", "after-sink-commit", has_invalid_records=False)
    'duplicated'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from streamproof.faults import points as faults
from streamproof.guarantees import wiring_for
from streamproof.harness.crashes import Crash, HarnessResult, TimelineEvent
from streamproof.harness.evidence import evidence_text


def expected_damage(
    guarantee: str,
    point: str,
    *,
    has_invalid_records: bool,
    check: str = "records",
    partial_writes_visible: bool = False,
) -> str:
    """The damage a guarantee must show when killed at a point: "clean", "duplicated", "lost", or
    "may-duplicate" / "may-lose" where it depends on how far the killed write got.

    A cell that should show damage and does not means the harness missed its fault (a blind harness),
    which is a failure too. Under at-least-once a kill in the middle of the sink write or after it
    duplicates the batch's quarantined records: the quarantine table commits before the sink and is
    appended again on replay; and where the sink shows a write before it is complete (PostgreSQL commits
    per partition, a non-transactional Kafka producer), the part written before the kill is written again.
    A sink holding the latest record per key (``check = "latest"``) absorbs a replay of its own rows.

    >>> expected_damage("at-least-once", "mid-sink-write", has_invalid_records=False)
    'clean'
    >>> expected_damage("at-least-once", "after-sink-commit", has_invalid_records=False, check="latest")
    'clean'
    >>> expected_damage("at-least-once", "after-sink-commit", has_invalid_records=True, check="latest")
    'duplicated'
    """
    wiring = wiring_for(guarantee)
    if wiring.may_duplicate:  # a replay writes again what an unkeyed write had written
        if point == faults.AFTER_SINK_COMMIT and check != "latest":
            return "duplicated"
        if point in (faults.MID_SINK_WRITE, faults.AFTER_SINK_COMMIT) and has_invalid_records:
            return "duplicated"  # the quarantine table was appended before the kill
        if point == faults.MID_SINK_WRITE and partial_writes_visible and check != "latest":
            return "may-duplicate"
    if wiring.may_lose and point == faults.BEFORE_SINK_WRITE:  # marked done before it was written
        return "lost"
    if wiring.may_lose and point == faults.MID_SINK_WRITE:
        return "may-lose" if partial_writes_visible else "lost"
    return "clean"


def fault_hits(where: str, sink: str, labels: Sequence[str]) -> bool:
    """Whether a fault armed at ``where`` hit ``sink``'s write, in a pipeline writing the sinks ``labels`` in that
    order: a point inside one sink's write (``mid-sink-write``, a fault of the machines) hits the sink it names
    (``point:label``), or the first when it names none (as :func:`streamproof.faults.points.mid_write_armed`
    arms it); any other (before the writes, after their commit, after the checkpoint's, a random kill) hits every sink
    of the batch.

    >>> [fault_hits(where, "pg", ["delta", "pg"]) for where in ("mid-sink-write", "mid-sink-write:pg",
    ...                                                         "after-sink-commit", "worker-loss:delta")]
    [False, True, True, False]
    """
    point, named = faults.split_point(where)
    return point not in faults.WRITE_POINTS or (named or labels[0]) == sink


def damage_to(
    sink: str,
    where: str,
    labels: Sequence[str],
    guarantee: str,
    *,
    has_invalid_records: bool,
    check: str = "records",
    partial_writes_visible: bool = False,
) -> str:
    """The damage a crash armed at ``where`` must leave in ``sink`` (:func:`expected_damage`), the sinks of a batch
    being written one after the other in the order of ``labels``. A kill in another sink's write is, to a sink
    written before that one, a kill after its commit; to one written after it, a kill in a write that never began
    (the quarantine committed, nothing of this sink written, so nothing partial).

    >>> how = {"has_invalid_records": False}
    >>> [damage_to(sink, "mid-sink-write:pg", ["delta", "pg", "kafka"], "at-least-once", **how)
    ...  for sink in ("delta", "pg", "kafka")]
    ['duplicated', 'clean', 'clean']
    >>> [damage_to(sink, "mid-sink-write:pg", ["delta", "pg", "kafka"], "at-most-once", **how)
    ...  for sink in ("delta", "pg", "kafka")]
    ['clean', 'lost', 'lost']
    """
    point, named = faults.split_point(where)
    if point == faults.MID_SINK_WRITE and not fault_hits(where, sink, labels):
        written_before = labels.index(sink) < labels.index(named or labels[0])
        return expected_damage(
            guarantee,
            faults.AFTER_SINK_COMMIT if written_before else faults.MID_SINK_WRITE,
            has_invalid_records=has_invalid_records,
            check=check,
        )
    return expected_damage(
        guarantee,
        point,
        has_invalid_records=has_invalid_records,
        check=check,
        partial_writes_visible=partial_writes_visible,
    )


def worst_damage(damages: Iterable[str]) -> str:
    """The damage several crashes must leave together: a certain damage over a possible one over none (a guarantee
    may lose or duplicate, never both).

    >>> worst_damage(["clean", "may-duplicate", "duplicated"]), worst_damage(["clean", "may-lose"]), worst_damage([])
    ('duplicated', 'may-lose', 'clean')
    """
    damages = set(damages)
    return next(
        (damage for damage in ("lost", "duplicated", "may-lose", "may-duplicate") if damage in damages), "clean"
    )


def credited(result: HarnessResult, sink: str, labels: Sequence[str]) -> tuple[list[Crash], list[str]]:
    """The crashes, and the faults missed, that a sink's row of a cell carries: those that hit it
    (:func:`fault_hits`); in a fan-out, a fault inside one sink's write is that sink's alone."""
    crashes = [crash for crash in result.crashes if fault_hits(crash.point, sink, labels)]
    missed = [
        line for where, line in zip(result.missed_at, result.missed, strict=True) if fault_hits(where, sink, labels)
    ]
    return crashes, missed


@dataclass
class MatrixCell:
    """One guarantee x crash point run, reconciled."""

    guarantee: str
    sink: str
    point: str
    lost: int
    duplicated: int
    unexpected: int
    crashes: list[dict[str, Any]]
    restart_s: float | None
    expected: str  # "clean", "duplicated" or "lost"
    seconds: float
    timeline: list[TimelineEvent] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # faults without evidence of happening: the cell fails
    trusted: list[str] = field(default_factory=list)  # terms of the verdict taken on trust (the report's reasons)
    identity_gap: int = 0  # records the reconciliation could not account for: the cell's counts prove nothing

    @property
    def evidence(self) -> str:
        """What shows the cell's fault happened, one line per fault (the crash facts, or Spark's task attempts)."""
        return " | ".join(evidence_text(crash.get("facts", {})) for crash in self.crashes) or "no fault recorded"

    @property
    def outcome(self) -> str:
        """What the cell showed: clean, lost, duplicated, lost+duplicated (unexpected rows count as damage), or
        missed: its fault left no evidence of happening, so its counts prove nothing."""
        if self.missed:
            return "missed"
        if self.identity_gap:
            return "unknown"
        damage = [
            name for name, count in (("lost", self.lost), ("duplicated", self.duplicated + self.unexpected)) if count
        ]
        return "+".join(damage) or "clean"

    @property
    def exactly_once(self) -> bool:
        """A cell of a guarantee that allows no damage at all."""
        return wiring_for(self.guarantee).exactly_once

    @property
    def as_expected(self) -> bool:
        """Whether the cell showed the damage its guarantee predicts: rows no record explains (unexpected) never are."""
        if self.missed or self.identity_gap or self.unexpected:
            return False
        if self.expected == "clean":
            return self.outcome == "clean"
        if self.expected.startswith("may-"):
            return self.outcome in ("clean", {"may-duplicate": "duplicated", "may-lose": "lost"}[self.expected])
        if wiring_for(self.guarantee).may_lose:
            return self.lost > 0 and self.duplicated == 0
        return getattr(self, self.expected) > 0 and self.lost == 0

    @property
    def why_not_as_expected(self) -> str:
        """Why the cell is not as expected, in a few words ("" when it is)."""
        if self.as_expected:
            return ""
        if self.missed:
            return f"its fault left no evidence ({'; '.join(self.missed)})"
        if self.unexpected and self.outcome != "unknown":
            return (
                f"{self.unexpected:,} rows no source record explains (lost {self.lost:,}, duplicated "
                f"{self.duplicated:,}): no guarantee allows them"
            )
        if self.identity_gap:
            return f"{self.identity_gap:,} records the reconciliation could not account for"
        counts = f"lost {self.lost:,}, duplicated {self.duplicated:,}, unexpected {self.unexpected:,}"
        blind = " (a fault that left no damage: a blind harness?)" if self.outcome == "clean" else ""
        return f"expected {self.expected}, showed {self.outcome}: {counts}{blind}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "guarantee": self.guarantee,
            "sink": self.sink,
            "point": self.point,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "unexpected": self.unexpected,
            "crashes": self.crashes,
            "restart_s": self.restart_s,
            "expected": self.expected,
            "outcome": self.outcome,
            "as_expected": self.as_expected,
            "missed": self.missed,
            "evidence": self.evidence,
            "trusted": self.trusted,
            "identity_gap": self.identity_gap,
            "seconds": round(self.seconds, 1),
            "timeline": [asdict(event) for event in self.timeline],
        }


def cells_not_as_expected(cells: Iterable[MatrixCell]) -> list[str]:
    """The matrix's verdict: one line per cell that did not show what its guarantee predicts, saying which and why;
    the matrix passes only when there is none. Every cell counts, not only exactly-once's: an at-least-once or
    at-most-once cell whose fault left no evidence, or no damage, is a blind harness, and proves nothing.

    >>> def cell(guarantee, expected, **counts):
    ...     return MatrixCell(guarantee, "delta", "after-sink-commit", **{"lost": 0, "duplicated": 0, "unexpected": 0,
    ...                       **counts}, crashes=[], restart_s=None, expected=expected, seconds=1.0)
    >>> cells_not_as_expected([cell("exactly-once", "clean"), cell("at-least-once", "duplicated", duplicated=40)])
    []
    >>> cells_not_as_expected([cell("at-least-once", "duplicated")])  # doctest: +NORMALIZE_WHITESPACE
    ['at-least-once x after-sink-commit [delta]: expected duplicated, showed clean: lost 0, duplicated 0,
      unexpected 0 (a fault that left no damage: a blind harness?)']
    """
    return [
        f"{cell.guarantee} x {cell.point} [{cell.sink}]: {cell.why_not_as_expected}"
        for cell in cells
        if not cell.as_expected
    ]


def guarantee_given(cells: Sequence[MatrixCell], sink: str) -> str:
    """What your own sink (``kind = "python"``) gave, from its exactly-once cells: streamproof hands it every batch
    there, replays after each crash included, and keeps no record in it, so loss or duplicates are its code's. Each
    cell is named with the moment of your write its crash landed at; a cell whose crash could not land in your write
    (no moment streamproof can see there) is "not exercised", and never makes the verdict "exactly-once".

    >>> def cell(point, moment=None, missed=(), **counts):
    ...     crashes = [{"facts": {"moment": {"what": moment, "where": "driver"}}}] if moment else []
    ...     return MatrixCell("exactly-once", "ledger", point, **{"lost": 0, "duplicated": 0, "unexpected": 0,
    ...                       **counts}, crashes=crashes, restart_s=None, expected="clean", seconds=1.0,
    ...                       missed=list(missed))
    >>> print(guarantee_given([cell("mid-sink-write#1", "after step 1: save", duplicated=120),
    ...                        cell("mid-sink-write#2", "after step 2: save"), cell("after-sink-commit")], "ledger"))
    ledger (your sink) gave at-least-once: duplicated 120 at mid-sink-write#1 (after step 1: save); clean at \
mid-sink-write#2 (after step 2: save); clean at after-sink-commit
    >>> guarantee_given([cell("mid-sink-write#1", missed=["not reached: nothing durable"]), cell("after-sink-commit")],
    ...                 "ledger")
    'ledger (your sink) gave exactly-once where exercised: clean at after-sink-commit; mid-sink-write#1 not exercised \
(not reached: nothing durable)'
    """
    mine = [cell for cell in cells if cell.sink == sink and cell.exactly_once]
    landed = [cell for cell in mine if not cell.missed]
    lost = any(cell.lost for cell in landed)
    doubled = any(cell.duplicated for cell in landed)
    wrong = any(cell.unexpected for cell in landed)  # rows no record explains: no guarantee allows them
    if not landed:
        verdict = "nothing proven (no crash landed in its write)"
    elif wrong or (lost and doubled):
        verdict = "no guarantee"
    elif lost or doubled:
        verdict = "at-most-once" if lost else "at-least-once"
    else:
        verdict = "exactly-once" if len(landed) == len(mine) else "exactly-once where exercised"
    parts = []
    for cell in landed:
        if not cell.crashes and cell.point.partition(":")[0].partition("#")[0] in faults.WRITE_POINTS:
            continue  # a crash inside another sink's write (a moment yours does not have): not one of yours
        counts = (("lost", cell.lost), ("duplicated", cell.duplicated), ("unexpected", cell.unexpected))
        damage = ", ".join(f"{name} {count:,}" for name, count in counts if count) or "clean"
        moments = [crash["facts"]["moment"]["what"] for crash in cell.crashes if crash.get("facts", {}).get("moment")]
        parts.append(f"{damage} at {cell.point}" + (f" ({'; '.join(moments)})" if moments else ""))
    parts += [f"{cell.point} not exercised ({'; '.join(cell.missed)})" for cell in mine if cell.missed]
    return f"{sink} (your sink) gave {verdict}: {'; '.join(parts)}"


def your_expected_damage(guarantee: str, damage: str, point: str) -> str:
    """The damage a cell must leave in your own sink, given the damage a sink streamproof writes would show there
    (``damage``): none under exactly-once (streamproof hands your write every batch, replays included; whether it then
    writes twice or loses is your code's, and the matrix fails on either). Under the weaker guarantees your code is
    held to what the guarantee allows, no more: at-least-once may duplicate (a replay your code does not absorb) and
    never lose; at-most-once may lose (its batch ids restart at every start, so a ledger keyed on them skips new
    batches) and never duplicate, and a batch marked done before it was handed to you is lost.

    >>> your_expected_damage("exactly-once", "clean", "after-sink-commit")
    'clean'
    >>> [your_expected_damage("at-least-once", damage, "after-sink-commit") for damage in ("clean", "duplicated")]
    ['may-duplicate', 'may-duplicate']
    >>> [your_expected_damage("at-most-once", "lost", p) for p in ("mid-sink-write", "before-sink-write")]
    ['may-lose', 'lost']
    """
    wiring = wiring_for(guarantee)
    if wiring.exactly_once:
        return "clean"
    if wiring.may_duplicate:
        return "may-duplicate"
    return "lost" if damage == "lost" and point == faults.BEFORE_SINK_WRITE else "may-lose"
