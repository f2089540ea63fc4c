"""The verdict a team can act on, per query of the job: the guarantee it gives, the damage each crash left, and why.

A proof of a job is a set of *cells*: one crash at one moment of one query's batch, then restarts until the topic is
drained, then every output compared with the crash-free twin's (:mod:`streamproof.jobs.compare`). From its query's
cells (pure functions, no Spark):

* ``exactly-once``: every cell landed and is clean in every reading; ``exactly-once where exercised`` when some cell's
  crash could not land (a miss is never counted clean);
* ``at-least-once``: duplicates and no loss; ``at-most-once``: loss and no duplicates; ``none``: both, or rows the
  twin never wrote;
* ``unknown``: the query's rows depend on something that differs from run to run (a nondeterministic expression in a
  filter or a join condition), so no comparison can say ok; ``nothing proven``: no crash landed.

Example::

    >>> clean = JobCell("orders", "after-sink-commit", 1, "commits/1 not written", None,
    ...                 [OutputCheck("s3://prod/t", "rows", "orders", RowCounts(twin_rows=10, rows=10))])
    >>> doubled = JobCell("orders", "mid-sink-write#1", 1, "after step 1: save", None,
    ...                   [OutputCheck("s3://prod/t", "rows", "orders", RowCounts(10, 13, duplicated=3))])
    >>> guarantee_of([clean, doubled], [])
    'at-least-once'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamproof.jobs.compare import RowCounts
from streamproof.jobs.outputs import READING_NAMES


@dataclass
class OutputCheck:
    """One output of the job in one reading, compared with the twin's."""

    address: str  # the job's own name for the output
    reading: str  # rows | spark | files | table <name>
    query: str | None  # the query that wrote it (None: the job, outside its batches)
    counts: RowCounts

    def to_dict(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "output": self.address,
            "reading": self.reading,
            "query": self.query,
            "twin_rows": counts.twin_rows,
            "rows": counts.rows,
            "lost": counts.lost,
            "duplicated": counts.duplicated,
            "unexpected": counts.unexpected,
            "left_out": counts.left_out,
            "samples": counts.samples,
        }


@dataclass
class JobCell:
    """One crash of the job at one moment, its restarts, and the comparison (see the module)."""

    query: str
    point: str  # the crash point, mid-sink-write#k for your write's moments
    batch_id: int
    landed: str | None  # where the kill landed, as the run wrote it before dying
    missed: str | None  # why it did not land where armed: the cell proves nothing
    checks: list[OutputCheck] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    runs: int = 0
    checker: str = "Spark"  # who counted ``checks``
    also: dict[str, list[OutputCheck]] = field(default_factory=dict)  # the same outputs counted by other checkers

    @property
    def checkers_agree(self) -> bool:
        """Whether every other checker counted the same terms, output by output and reading by reading."""
        mine = sorted((c.address, c.reading, c.counts.terms()) for c in self.checks)
        return all(
            sorted((c.address, c.reading, c.counts.terms()) for c in other) == mine for other in self.also.values()
        )

    def damage(self, reading: str | None = None) -> tuple[int, int, int]:
        """Lost, duplicated and unexpected summed over the cell's outputs (of one reading, when given)."""
        checks = [check for check in self.checks if reading is None or check.reading == reading]
        return (
            sum(check.counts.lost for check in checks),
            sum(check.counts.duplicated for check in checks),
            sum(check.counts.unexpected for check in checks),
        )

    @property
    def outcome(self) -> str:
        if self.missed:
            return "missed"
        lost, duplicated, unexpected = self.damage()
        parts = [
            name for name, count in (("lost", lost), ("duplicated", duplicated), ("unexpected", unexpected)) if count
        ]
        return "+".join(parts) or "clean"

    def to_dict(self) -> dict[str, Any]:
        lost, duplicated, unexpected = self.damage()
        return {
            "query": self.query,
            "point": self.point,
            "batch_id": self.batch_id,
            "landed": self.landed,
            "missed": self.missed,
            "outcome": self.outcome,
            "lost": lost,
            "duplicated": duplicated,
            "unexpected": unexpected,
            "facts": self.facts,
            "runs": self.runs,
            "seconds": round(self.seconds, 1),
            "outputs": [check.to_dict() for check in self.checks],
            "checker": self.checker,
            "also": {name: [check.to_dict() for check in checks] for name, checks in self.also.items()},
            "checkers_agree": self.checkers_agree,
        }


def guarantee_of(cells: list[JobCell], unknown: list[str], reading: str | None = None) -> str:
    """The guarantee the cells show (see the module), in one reading when given."""
    landed = [cell for cell in cells if not cell.missed]
    if not cells or not landed:
        return "nothing proven"
    damages = [cell.damage(reading) for cell in landed]
    lost = any(d[0] for d in damages)
    doubled = any(d[1] for d in damages)
    wrong = any(d[2] for d in damages)
    if wrong or (lost and doubled):
        return "none"
    if lost:
        return "at-most-once"
    if doubled:
        return "at-least-once"
    if unknown:
        return "unknown"
    return "exactly-once" if len(landed) == len(cells) else "exactly-once where exercised"


def why_of(sink: str, function: str | None, cells: list[JobCell], moments: list[str]) -> str:
    """One line of why the query gives what it gives, from the cells that found damage (or the sink, when clean).

    >>> cell = JobCell("q", "mid-sink-write#1", 1, "after step 1: DataFrameWriter.save('s3://p/orders')", None,
    ...                [OutputCheck("s3://p/orders", "rows", "q", RowCounts(duplicated=5))])
    >>> why_of("foreachBatch", "idempotent_write", [cell], ["after step 1: DataFrameWriter.save('s3://p/orders')",
    ...                                                      "after step 2: DataFrameWriter.save('s3://p/control')"])
    "2 durable steps in idempotent_write: DataFrameWriter.save('s3://p/orders'), then \
DataFrameWriter.save('s3://p/control'); killed after the first, the replay wrote its rows again"
    """
    damaged = [cell for cell in cells if not cell.missed and cell.outcome != "clean"]
    if not damaged:
        return {
            "delta": "Spark's Delta sink commits each batch with a transaction id (the query's id, the batch id): "
            "a replayed batch is skipped",
            "kafka": "no crash point left a duplicate (Spark's Kafka sink is at-least-once by its documentation)",
        }.get(sink, "no crash point left damage in any output")
    first = damaged[0]
    point = first.point.partition("#")[0]
    if sink in ("foreachBatch", "foreach") and point == "mid-sink-write" and "#" in first.point:
        k = int(first.point.partition("#")[2])
        steps = [moment.split(": ", 1)[-1] for moment in moments]
        if len(steps) > 1 and k < len(steps):
            ordinal = {1: "first", 2: "second", 3: "third"}.get(k, f"{k}th")
            return (
                f"{len(steps)} durable steps in {function or 'your write'}: {', then '.join(steps)}; killed after the "
                f"{ordinal}, the replay wrote its rows again"
            )
    if sink in ("parquet", "json", "csv", "orc", "text") and point == "mid-sink-write":
        return (
            "Spark's file sink writes a batch's files before its commit (_spark_metadata): killed between them, the "
            "replay writes them again; readers of the folder's files see both, Spark's reader honours the log"
        )
    if sink == "kafka":
        return (
            f"Spark's Kafka sink is at-least-once: at {first.point} the batch's records were produced and Spark's "
            "commit was not written; the replay produced them again"
        )
    lost, duplicated, unexpected = first.damage()
    terms = ", ".join(f"{name} {count:,}" for name, count in (("lost", lost), ("duplicated", duplicated),
                                                            ("unexpected", unexpected)) if count)  # fmt: skip
    return f"{terms} after a crash at {first.point} ({first.landed or 'its moment'})"


def reading_label(reading: str) -> str:
    """How a reading is named in the report.

    >>> reading_label("files"), reading_label("table orders")
    ('its files (as pyarrow, Hive or Trino read the folder)', 'table orders')
    """
    return READING_NAMES.get(reading, reading)
