"""The reconciliation report of one sink: the checker's counts, what was checked, and the crashes behind it.

``to_dict`` gives DESIGN.md's JSON format; :func:`reports_document` the document of ``verify --json``.

Example::

    >>> report = Report(pipeline="orders", guarantee="at-least-once", sink="delta", source_records=10, expected=10,
    ...                 quarantined=0, upstream_duplicates=0, sink_records=12, lost=0, duplicated=2, unexpected=0)
    >>> report.verdict, report.guarantee_held, report.identity_holds
    ('damaged', True, True)

The verdict is three-valued: ``ok`` (nothing lost, doubled or unexpected, and every source record accounted for),
``damaged`` (something was), or ``unknown`` (no damage found, but the identity does not add up, or a term could
not be checked, so the counts cannot be trusted either way: :attr:`Report.reasons` says why). ``verify`` exits 0,
1 and 3 for them. ``basis`` says per term whether it was ``recomputed`` from the source and the checkpoint,
``trusted: ...`` from something the pipeline wrote (the quarantine table's late records, when the offset log no
longer reaches back to batch 0), or ``unknown: ...``: nothing durable says, so it was not checked (the records
``dedup.late = "drop"`` may have dropped in batches the offset log no longer holds; :func:`unlogged_late_basis`).
The records of a pipeline still running (or stopped midway) past what its checkpoint and sink have committed are
``not_yet_read``, a term of the identity of their own, never lost (:mod:`streamproof.reconcile.read_through`); they
do not change the verdict. ``read_through`` shows the checkpoint's bounds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from streamproof.guarantees import wiring_for
from streamproof.reconcile.counts import Counts

OK, DAMAGED, UNKNOWN = "ok", "damaged", "unknown"
RECOMPUTED = "recomputed"
TRUSTED, UNCHECKED = "trusted: ", "unknown: "  # the prefixes of a basis that is not recomputed
VERDICT_EXIT_CODES = {OK: 0, DAMAGED: 1, UNKNOWN: 3}  # of ``streamproof verify``


@dataclass(kw_only=True)
class Report(Counts):
    """The reconciliation report of one sink; ``to_json`` gives DESIGN.md's format."""

    pipeline: str
    guarantee: str
    sink: str
    unit: str = "records"  # what expected/lost/duplicated count: records, keys (latest) or groups (totals)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    generated: dict[str, Any] | None = None
    # Per term of the identity: "recomputed" (from the source and the checkpoint) or "trusted: <what>".
    basis: dict[str, str] = field(default_factory=dict)
    # Why the counts cannot be trusted whatever they say (the source lost records a key or a total depends on).
    unverifiable: str = ""
    # How far the pipeline has read, per topic and partition: {"committed": C, "planned": P} from the checkpoint;
    # the source's records past what it and the sink committed are not_yet_read (streamproof.reconcile.read_through).
    read_through: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    no_cut: str = ""  # why no cut was made: every record was checked to the source's end
    other_writers: list[str] = field(default_factory=list)  # commits of other processes that changed the sink's rows

    @property
    def damaged(self) -> bool:
        """Whether anything was lost, doubled or unexpected."""
        return bool(self.lost or self.duplicated or self.unexpected)

    @property
    def verdict(self) -> str:
        """``ok``, ``damaged`` or ``unknown`` (no damage found but the identity fails, or a term could not be
        checked: see :attr:`reasons`)."""
        if self.unverifiable:
            return UNKNOWN
        if self.damaged:
            return DAMAGED
        return OK if self.identity_holds and not self.unchecked else UNKNOWN

    @property
    def ok(self) -> bool:
        return self.verdict == OK

    @property
    def trusted(self) -> dict[str, str]:
        """The terms taken on trust from something the pipeline wrote, with what they trusted."""
        return {
            term: how.removeprefix(TRUSTED)
            for term, how in self.basis.items()
            if how != RECOMPUTED and not how.startswith(UNCHECKED)
        }

    @property
    def unchecked(self) -> dict[str, str]:
        """The terms nothing durable could check, with why: the verdict is then ``unknown`` unless damage was found."""
        return {term: how.removeprefix(UNCHECKED) for term, how in self.basis.items() if how.startswith(UNCHECKED)}

    @property
    def reasons(self) -> list[str]:
        """Why the verdict is not a plain ``ok``: the identity's gap, and every term taken on trust."""
        reasons = [self.unverifiable] if self.unverifiable else []
        if self.unavailable:
            reasons.append(
                f"{self.unavailable:,} sink rows come from records the source no longer holds "
                "(retention): unavailable, not compared"
            )
        if not self.identity_holds:
            names = " + ".join(name for name, _ in self.identity_terms)
            reasons.append(
                f"source = {names} does not hold: {self.identity_gap:+,} records unaccounted for "
                "(a record read twice, or a term miscounted)"
            )
        if self.no_cut and self.lost and self.no_cut != self.unverifiable:
            reasons.append(f"lost may include records not yet read ({self.no_cut})")
        if self.other_writers:
            reasons.append(
                f"other writers changed this table ({', '.join(self.other_writers)}): the counts include "
                "their rows, a row one appended as unexpected, a row one deleted as lost"
            )
        reasons += [f"{term} trusted: {what}" for term, what in self.trusted.items()]
        reasons += [f"{term} not checked: {what}" for term, what in self.unchecked.items()]
        return reasons

    @property
    def identity_terms(self) -> list[tuple[str, int]]:
        """The terms that must add up to ``source_records``, each counted on its own, named as printed."""
        if self.your_code:
            delivered = [("given to your code", self.transformed)]
        elif self.unit == "windows":
            delivered = [("in closed windows", self.aggregated), ("in open windows", self.pending)]
        else:
            delivered = [("expected", self.expected)]
            if self.superseded or self.unit != "records":
                delivered.append(("superseded", self.superseded))
        terms = [*delivered, ("quarantined", self.quarantined), ("upstream dups", self.upstream_duplicates)]
        if self.dropped_late:
            terms.append(("dropped late", self.dropped_late))
        if self.quarantine_lost:  # lost from quarantine: still a source record, accounted for as lost
            terms.append(("lost from quarantine", self.quarantine_lost))
        if self.not_yet_read:  # past what the checkpoint and the sink committed: counted from their coordinates
            terms.append(("not yet read", self.not_yet_read))
        return terms

    @property
    def identity_gap(self) -> int:
        """``source_records`` minus the sum of the identity's terms: 0 when every record is accounted for once."""
        return self.source_records - sum(value for _, value in self.identity_terms)

    @property
    def guarantee_held(self) -> bool:
        """Whether the damage found is within what the guarantee promises.

        exactly-once allows none; at-least-once allows duplicates, never loss; at-most-once allows loss,
        never duplicates. Unexpected rows are never allowed, nor wrong values (counted in ``duplicated``, but no
        replay or skipped batch makes a total with the right record count and another sum).
        """
        wiring = wiring_for(self.guarantee)
        doubled = self.duplicated - self.wrong_values
        allowed = wiring.allows(lost=self.lost, duplicated=doubled, unexpected=self.unexpected)
        return allowed and not self.wrong_values and self.identity_holds

    @property
    def identity_holds(self) -> bool:
        return self.identity_gap == 0

    def to_dict(self) -> dict[str, Any]:
        data = {"pipeline": self.pipeline, "guarantee": self.guarantee, "sink": self.sink, **asdict(self)}
        if self.generated is None:
            data.pop("generated")
        if not self.no_cut:
            data.pop("no_cut")
        if not self.other_writers:
            data.pop("other_writers")
        data["ok"] = self.ok
        data["verdict"] = self.verdict
        data["reasons"] = self.reasons
        data["identity_gap"] = self.identity_gap
        data["guarantee_held"] = self.guarantee_held
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def reports_document(reports: list[Report]) -> dict[str, Any]:
    """The JSON document of ``verify --json``: DESIGN's report for one sink; per sink for a fan-out."""
    if len(reports) == 1:
        return reports[0].to_dict()
    return {
        "pipeline": reports[0].pipeline,
        "guarantee": reports[0].guarantee,
        "sinks": [report.to_dict() for report in reports],
        "ok": all(report.ok for report in reports),
        "verdict": worst_verdict(reports),
    }


def worst_verdict(reports: list[Report]) -> str:
    """The verdict of several sinks: damaged if any is, else unknown if any is, else ok.

    >>> worst_verdict([])
    'ok'
    """
    verdicts = {report.verdict for report in reports}
    return next((v for v in (DAMAGED, UNKNOWN) if v in verdicts), OK)


def unlogged_late_basis(first_logged: int, late: str, possibly_late: int, unseen: int) -> str:
    """How the late records of the batches the offset log no longer holds (0 to ``first_logged``: Spark keeps the
    last 100) are known; the batches after it are recomputed. Their watermarks are gone, but Spark's watermark never
    moves back, so none of them judged late records by a later one than ``first_logged``'s own: a record of theirs
    newer than it was not late. Of the ``possibly_late`` older ones, the quarantine table lists which were late
    (``late = "quarantine"``); with ``late = "drop"`` nothing does: the ``unseen`` ones the sink does not hold were
    dropped or lost, which cannot be told, so that term is ``unknown`` (counted as dropped, never as lost).

    >>> unlogged_late_basis(20, "drop", 0, 0)
    'recomputed'
    >>> unlogged_late_basis(20, "drop", 130, 0).startswith(TRUSTED), unlogged_late_basis(20, "drop", 130, 9)[:14]
    (True, 'unknown: 9 rec')
    """
    if not possibly_late:
        return RECOMPUTED
    older = f"records of batches 0-{first_logged} older than batch {first_logged}'s watermark"
    why = (
        f"the checkpoint's offset log starts at batch {first_logged}, so the watermarks those batches judged late "
        "records by are gone"
    )
    if late == "quarantine":
        return f"{TRUSTED}which of the {possibly_late:,} {older} were late, as the quarantine table lists them ({why})"
    if unseen:
        return (
            f"{UNCHECKED}{unseen:,} {older} are not in the sink: dropped as late or lost, which cannot be told "
            f'(dedup.late = "drop" keeps no record of what it dropped, and {why}); counted as dropped, not '
            "checked"
        )
    return f"{TRUSTED}the sink holds the {possibly_late:,} {older} (which may have been dropped as late) ({why})"
