"""The reconciliation report of one sink: the checker's counts, what was checked, and the crashes behind it.

``to_dict`` gives DESIGN.md's JSON format; :func:`reports_document` the document of ``verify --json``.

Example::

    >>> report = Report(pipeline="orders", guarantee="at-least-once", sink="delta", source_records=10, expected=10,
    ...                 quarantined=0, upstream_duplicates=0, sink_records=12, lost=0, duplicated=2, unexpected=0)
    >>> report.ok, report.guarantee_held, report.identity_holds
    (False, True, True)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from streamproof.guarantees import wiring_for
from streamproof.reconcile.checker import Counts


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

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0

    @property
    def guarantee_held(self) -> bool:
        """Whether the damage found is within what the guarantee promises.

        exactly-once allows none; at-least-once allows duplicates, never loss; at-most-once allows loss,
        never duplicates. Unexpected rows are never allowed.
        """
        wiring = wiring_for(self.guarantee)
        return wiring.allows(lost=self.lost, duplicated=self.duplicated, unexpected=self.unexpected)

    @property
    def identity_holds(self) -> bool:
        delivered = self.aggregated + self.pending if self.unit == "windows" else self.expected + self.superseded
        return self.source_records == delivered + self.quarantined + self.upstream_duplicates + self.dropped_late

    def to_dict(self) -> dict[str, Any]:
        data = {"pipeline": self.pipeline, "guarantee": self.guarantee, "sink": self.sink, **asdict(self)}
        if self.generated is None:
            data.pop("generated")
        data["ok"] = self.ok
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
    }
