"""The small records streamproof keeps inside Spark's checkpoint folder, beside Spark's logs (names starting with
``_streamproof``, which Spark ignores and an at-most-once start keeps): how many times a pipeline started, and the
last batch that wrote quarantine rows. They go where the checkpoint goes (backup, restore).
"""

from __future__ import annotations

import json

from streamproof.errors import PipelineError
from streamproof.storage.claimed_log import ClaimedLog
from streamproof.storage.location import Location


class RunCounter:
    """``<checkpoint>/_streamproof_runs``: how many times a pipeline started on this checkpoint (restarts + 1).

    >>> import tempfile
    >>> counter = RunCounter(Location(tempfile.mkdtemp()))
    >>> counter.count_start(), counter.count_start()
    (1, 2)
    """

    NAME = "_streamproof_runs"

    def __init__(self, checkpoint: Location) -> None:
        self.checkpoint = checkpoint
        self.path = checkpoint / self.NAME

    def count_start(self) -> int:
        """One more start; returns the total."""
        try:
            runs = int(self.path.read_text()) + 1
        except (OSError, ValueError):
            runs = 1
        self.checkpoint.mkdir()
        self.path.write_text(str(runs))
        return runs


class QuarantineMark:
    """``<checkpoint>/_streamproof_quarantine_marks/``: the last batch whose quarantine rows were committed
    (exactly-once), a :class:`ClaimedLog` the run claims for its lease before its first batch.

    Written after that commit, so it never runs ahead of the quarantine table; a table found behind it lost commits
    (or was deleted), which the quarantine's own log cannot tell (a batch without invalid records writes no
    quarantine commit). A run that lost its lease never sets it back to its own batch
    (``tests/test_checkpoint_recovery.py::test_a_run_that_lost_its_lease_never_sets_the_quarantine_mark_back``); a
    damaged mark is refused, never taken as "no mark", which would turn the check off. ``_streamproof_quarantine``,
    the single file of older versions, is read until the first entry exists.

    >>> import tempfile
    >>> mark = QuarantineMark(Location(tempfile.mkdtemp()))
    >>> mark.read(), mark.record(4), mark.read()
    (None, None, 4)
    """

    NAME = "_streamproof_quarantine"
    FOLDER = "_streamproof_quarantine_marks"

    def __init__(self, checkpoint: Location) -> None:
        self.path = checkpoint / self.NAME
        self.log = ClaimedLog(checkpoint / self.FOLDER, "the last batch that wrote quarantine rows")

    def _newest(self) -> tuple[int, dict[str, object]]:
        number, mark = self.log.newest_record({})
        if number >= 0:
            batch = mark.get("batch", 0)
            if not isinstance(batch, int) or isinstance(batch, bool):
                raise self.log.damaged(self.log.entry(number), json.dumps(mark))
            return number, mark
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return -1, {}
        try:
            batch = int(text.strip()) if text.strip().isascii() else -1
        except ValueError:
            batch = -1
        if batch < 0:
            raise PipelineError(
                f"{self.path} is damaged ({text[:40]!r} is not a batch id): it names the last batch that wrote "
                "quarantine rows, so that a quarantine table that lost commits is told; restore a checkpoint backup, "
                "or delete the file (the check then starts again with the next batch that quarantines records)"
            )
        return -1, {"batch": batch}

    def fence(self, holder: str) -> None:
        """Claim the mark for the lease ``holder``; from here on another lease's entry stops this run's writes."""
        self.log.claim(holder, self._newest)

    def record(self, batch_id: int) -> None:
        number, mark = self._newest()
        self.log.append(number, {"batch": batch_id}, read=mark)

    def read(self) -> int | None:
        """The batch marked; None when no batch ever wrote quarantine rows (no mark)."""
        batch = self._newest()[1].get("batch")
        return batch if isinstance(batch, int) else None
