"""The checkpoint folder as streamproof looks after it: the run lock, at-most-once's progress file, and whole
copies (backup, restore). Spark's own logs in it are read by :mod:`streamproof.checkpoint.log`.

streamproof's own files in the folder start with ``_streamproof`` (Spark ignores them; an at-most-once start,
which wipes Spark's logs, keeps them).

Example::

    >>> import tempfile
    >>> checkpoint = Location(tempfile.mkdtemp()) / "orders"
    >>> with RunLock(checkpoint):
    ...     RunLock(checkpoint).holder() is None   # this process holds it; another one would be refused
    True
"""

from __future__ import annotations

import json
import os
import time

from streamproof.checkpoint.log import Checkpoint
from streamproof.errors import PipelineError
from streamproof.storage import Location


class ProgressFile:
    """At-most-once progress: the end offsets of the last batch marked done *before* it was written.

    Kept beside Spark's logs in the checkpoint folder; every start of an at-most-once pipeline wipes
    Spark's logs (so nothing is replayed) and starts reading from these offsets.

    Example::

        >>> import tempfile
        >>> progress = ProgressFile(Location(tempfile.mkdtemp()))
        >>> progress.mark_done({"orders": {"0": 120, "1": 98}}, batch_id=4)
        >>> progress.starting_offsets()
        '{"orders": {"0": 120, "1": 98}}'
    """

    NAME = "_streamproof_progress.json"

    def __init__(self, checkpoint: Location) -> None:
        self.checkpoint = checkpoint
        self.path = checkpoint / self.NAME

    def starting_offsets(self) -> str | None:
        """Spark ``startingOffsets`` JSON of the last batch marked done, or None before the first batch."""
        if not self.path.exists():
            return None
        try:
            return json.dumps(json.loads(self.path.read_text())["end_offsets"], sort_keys=True)
        except (json.JSONDecodeError, KeyError) as error:
            raise PipelineError(
                f"{self.path}: unreadable at-most-once progress ({error}); "
                "delete it to restart from source.starting_offsets"
            ) from None

    def mark_done(self, end_offsets: dict[str, dict[str, int]], batch_id: int) -> None:
        """Durably record the batch as done (written aside, then renamed over the progress: all or nothing)."""
        self.checkpoint.mkdir()
        self.path.replace_with_text(json.dumps({"batch_id": batch_id, "end_offsets": end_offsets}, sort_keys=True))

    def wipe_spark_logs(self) -> None:
        """Delete Spark's logs in the checkpoint (not the progress): the next start replays nothing."""
        for name in self.checkpoint.names():
            if not name.startswith("_streamproof"):  # this progress, the run lock, the run counter
                (self.checkpoint / name).delete(recursive=True)


class RunLock:
    """``<checkpoint>/_streamproof_run.pid`` while a pipeline runs on the checkpoint: a second run, a backup or a
    restore is refused while the process that holds it is alive (a stale file, left by a killed run, is taken
    over). The file is created only if absent (atomically, on HDFS too), so two starts at the same moment cannot
    both hold it. A holder's liveness is checked on this machine: a lock held from another host is refused until
    its file is removed.

    Example::

        >>> import tempfile
        >>> with RunLock(Location(tempfile.mkdtemp())) as lock:
        ...     lock.holder() is None    # this process holds it: another one would be refused
        True
    """

    NAME = "_streamproof_run.pid"

    def __init__(self, checkpoint: Location) -> None:
        self.path = checkpoint / self.NAME

    def holder(self) -> int | None:
        """Pid of a live process (other than this one) holding the lock, else None."""
        try:
            pid = int(self.path.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid if pid != os.getpid() else None

    def __enter__(self) -> RunLock:
        mine = str(os.getpid())
        for _ in range(2):
            if self.path.create_new(mine):
                return self
            holder = self.holder()
            if holder is not None:
                raise PipelineError(f"{self.path.parent} is in use by a running pipeline (pid {holder}); stop it first")
            self.path.delete()  # stale: its process is gone
        raise PipelineError(f"{self.path}: another process took the run lock at the same moment; try again")

    def __exit__(self, *exc: object) -> None:
        self.path.delete()


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
    """``<checkpoint>/_streamproof_quarantine``: the last batch whose quarantine rows were committed (exactly-once).

    Written after that commit, so it never runs ahead of the quarantine table; a table found behind it lost
    commits (or was deleted), which the quarantine's own log cannot tell (a batch without invalid records writes
    no quarantine commit).

    >>> import tempfile
    >>> mark = QuarantineMark(Location(tempfile.mkdtemp()))
    >>> mark.read(), mark.record(4), mark.read()
    (None, None, 4)
    """

    NAME = "_streamproof_quarantine"

    def __init__(self, checkpoint: Location) -> None:
        self.checkpoint = checkpoint
        self.path = checkpoint / self.NAME

    def record(self, batch_id: int) -> None:
        self.path.write_text(str(batch_id))

    def read(self) -> int | None:
        try:
            return int(self.path.read_text())
        except (OSError, ValueError, PipelineError):
            return None


def refuse_while_running(checkpoint: Checkpoint, action: str) -> None:
    holder = RunLock(Location(checkpoint)).holder()
    if holder is not None:
        raise PipelineError(
            f"cannot {action} {checkpoint} while a pipeline runs on it (pid {holder}): stop it first (SIGTERM "
            "stops it after the batch in flight), so that the copy is consistent"
        )


def backup(checkpoint: Checkpoint, target: Checkpoint | None = None) -> Location:
    """Copy the checkpoint (not while a pipeline runs on it) to ``target`` (default: a stamped sibling).

    ``checkpoint`` and ``target`` are local paths or URIs, e.g. ``backup("hdfs://nn:9000/checkpoints/orders")``.
    """
    checkpoint, target = Location(checkpoint), (Location(target) if target is not None else None)
    if not checkpoint.is_dir():
        raise PipelineError(f"{checkpoint}: no checkpoint to back up")
    refuse_while_running(checkpoint, "back up")
    target = target or checkpoint.with_name(f"{checkpoint.name}.backup-{time.strftime('%Y%m%dT%H%M%S')}")
    if target.exists():
        raise PipelineError(f"{target} exists already: choose another backup path")
    checkpoint.copy_tree(target, skip=(RunLock.NAME,))
    return target


def restore(checkpoint: Checkpoint, source: Checkpoint) -> Location | None:
    """Replace the checkpoint by the backup ``source``; the current one is kept aside (returned).

    Restoring an older backup is safe with streamproof's sinks: the batches the sinks hold beyond it are
    replayed with the same ids and offsets, and each keyed sink skips them.
    """
    checkpoint, source = Location(checkpoint), Location(source)
    if not (source / "offsets").is_dir():
        raise PipelineError(f"{source}: not a checkpoint backup (no offsets/ folder)")
    refuse_while_running(checkpoint, "restore")
    aside = None
    if checkpoint.exists():
        aside = checkpoint.with_name(f"{checkpoint.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}")
        checkpoint.rename(aside)
    source.copy_tree(checkpoint)
    return aside
