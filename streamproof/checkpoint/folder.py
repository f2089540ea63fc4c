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

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from streamproof.checkpoint.log import Checkpoint
from streamproof.errors import PipelineError
from streamproof.faults.points import process_info
from streamproof.storage.location import Location


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


@dataclass(frozen=True)
class Holder:
    """The process named in a run lock: its pid and host (``pid@host``; a bare pid, as older locks hold, is of this
    host). Shown as the pid, with the host when it is another one.

    >>> Holder.parse("4242@worker-7")
    Holder(pid=4242, host='worker-7')
    >>> str(Holder(4242, "worker-7")), Holder.parse("oops")
    ('4242 on host worker-7', None)
    """

    pid: int
    host: str

    @classmethod
    def me(cls) -> Holder:
        return cls(os.getpid(), socket.gethostname())

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        pid, _, host = text.strip().partition("@")
        try:
            return cls(int(pid), host or socket.gethostname())
        except ValueError:
            return None

    @property
    def here(self) -> bool:
        return self.host == socket.gethostname()

    def alive(self) -> bool:
        """Whether the process runs. One on another host is taken to: its liveness cannot be checked from here."""
        if not self.here:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return process_state(self.pid) not in ("Z", None)  # a killed process its parent has not reaped yet: gone

    def __str__(self) -> str:
        return str(self.pid) if self.here else f"{self.pid} on host {self.host}"


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``Z``: exited, not reaped), None when there is no such process."""
    info = process_info(pid)
    return info.state if info is not None else None


class RunLock:
    """``<checkpoint>/_streamproof_run.pid`` while a pipeline runs on the checkpoint: a second run, a backup or a
    restore is refused while the process that holds it is alive (a stale file, left by a killed run, is taken
    over; one that exists but cannot be read is refused, never taken over). The file is created only if absent
    (atomically, on HDFS too), so two starts at the same moment cannot both hold it; taking over a stale one happens
    under a lock of this host, one process at a time, so two that find it stale together cannot both take it. A
    holder's liveness is checked on this machine: a lock held from another host is refused until its file is
    removed.

    Example::

        >>> import tempfile
        >>> with RunLock(Location(tempfile.mkdtemp())) as lock:
        ...     lock.holder() is None    # this process holds it: another one would be refused
        True
    """

    NAME = "_streamproof_run.pid"
    READS = 5  # an unreadable lock file is read this many times, READ_PAUSE_S apart, before it is refused
    READ_PAUSE_S = 0.2

    def __init__(self, checkpoint: Location) -> None:
        self.path = checkpoint / self.NAME

    def holder(self) -> Holder | None:
        """The live process (other than this one) holding the lock, else None (:meth:`_written_holder`: a lock file
        that exists but cannot be read is refused, never taken for "no holder")."""
        holder = self._written_holder()
        if holder is None or holder == Holder.me() or not holder.alive():
            return None
        return holder

    def _written_holder(self) -> Holder | None:
        """The process the lock file names; None only when the file does not exist. A file that exists but cannot
        be read (permissions, an I/O error, a folder in its place) or names no process (being written) is read again
        for a moment, then refused in one line naming it: taking it over could delete the lock of a live run."""
        problem = ""
        for attempt in range(self.READS):
            if attempt:
                time.sleep(self.READ_PAUSE_S)
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                return None
            except OSError as error:
                problem = f"cannot be read ({error.strerror or error})"
                continue
            if (holder := Holder.parse(text)) is not None:
                return holder
            problem = f"names no process ({text.strip()[:40]!r})"
        raise PipelineError(
            f"{self.path}: the run lock exists but {problem} after {self.READS} reads in "
            f"{(self.READS - 1) * self.READ_PAUSE_S:.1f} s; it is not taken over: if no pipeline runs on "
            f"{self.path.parent}, delete it"
        )

    def try_acquire(self) -> Holder | None:
        """Take the lock, taking over a stale one; returns None when taken, else the live process that holds it."""
        mine = f"{os.getpid()}@{socket.gethostname()}"
        for _ in range(5):
            if self.path.create_new(mine):
                return None
            with _host_mutex(self.path):
                written = self._written_holder()
                if written is None:
                    continue  # released in between: try to create it again
                if written != Holder.me() and written.alive():
                    return written
                # Stale: its process is gone. The file exists, so no start can create it, and no other process
                # deletes it while this one holds the mutex: what is deleted is the stale file, never a fresh one.
                self.path.delete()
        raise PipelineError(f"{self.path}: other processes kept taking and leaving the run lock; try again")

    def __enter__(self) -> RunLock:
        holder = self.try_acquire()
        if holder is not None:
            hint = "" if holder.here else f" (not checked from here: if it is gone, delete {self.path})"
            raise PipelineError(
                f"{self.path.parent} is in use by a running pipeline (pid {holder}); stop it first{hint}"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.path.delete()


@contextlib.contextmanager
def _host_mutex(lock: Location) -> Iterator[None]:
    """An exclusive lock of this host on ``lock``'s name (``flock`` on a file in the temporary folder), released
    when the process ends however it ends."""
    key = hashlib.sha256(str(lock).encode()).hexdigest()[:24]
    folder = Path(tempfile.gettempdir()) / "streamproof-locks"
    folder.mkdir(exist_ok=True)
    with open(folder / f"{key}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
    no quarantine commit). Written aside and renamed over the mark, so a crash leaves the old mark or the new one,
    never a torn one; a mark that cannot be read all the same (damaged storage) is refused, never taken as "no
    mark", which would turn the check off.

    >>> import tempfile
    >>> mark = QuarantineMark(Location(tempfile.mkdtemp()))
    >>> mark.read(), mark.record(4), mark.read()
    (None, None, 4)
    >>> mark.path.write_text("1")
    >>> mark.path.write_text("")  # a torn write
    >>> mark.read()
    Traceback (most recent call last):
    ...
    streamproof.errors.PipelineError: ...
    """

    NAME = "_streamproof_quarantine"

    def __init__(self, checkpoint: Location) -> None:
        self.checkpoint = checkpoint
        self.path = checkpoint / self.NAME

    def record(self, batch_id: int) -> None:
        self.path.replace_with_text(str(batch_id))

    def read(self) -> int | None:
        """The batch marked; None when no batch ever wrote quarantine rows (no mark)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            return int(text)
        except ValueError:
            raise PipelineError(
                f"{self.path} is damaged ({text[:40]!r} is not a batch id): it names the last batch that wrote "
                "quarantine rows, so that a quarantine table that lost commits is told; restore a checkpoint backup, "
                "or delete the file (the check then starts again with the next batch that quarantines records)"
            ) from None


def aside(checkpoint: Location, why: str) -> Location:
    """A free sibling name to keep a checkpoint aside under: ``<name>.<why>-<time>``, numbered when one of that second
    exists already (two restores in one second must not collide).

    >>> import tempfile
    >>> checkpoint = Location(tempfile.mkdtemp()) / "orders"
    >>> first = aside(checkpoint, "replaced"); first.mkdir()
    >>> second = aside(checkpoint, "replaced")
    >>> first.name.startswith("orders.replaced-"), second.name == first.name + "-2"
    (True, True)
    """
    base = checkpoint.with_name(f"{checkpoint.name}.{why}-{time.strftime('%Y%m%dT%H%M%S')}")
    candidate, number = base, 1
    while candidate.exists():
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


def kept_aside(checkpoint: Location, why: str) -> list[Location]:
    """The checkpoints :func:`aside` named for ``why`` beside ``checkpoint``, oldest first.

    >>> import tempfile
    >>> checkpoint = Location(tempfile.mkdtemp()) / "orders"
    >>> first = aside(checkpoint, "replaced"); first.mkdir()
    >>> second = aside(checkpoint, "replaced"); second.mkdir()
    >>> kept_aside(checkpoint, "replaced") == [first, second]
    True
    """
    prefix = f"{checkpoint.name}.{why}-"
    stamps = [name.removeprefix(prefix) for name in checkpoint.parent.names() if name.startswith(prefix)]

    def order(stamp: str) -> tuple[str, int]:  # <time>, then <time>-2, <time>-3, ... (one second, several)
        time_part, _, number = stamp.partition("-")
        return time_part, int(number or 1)

    return [checkpoint.with_name(f"{prefix}{stamp}") for stamp in sorted(stamps, key=order)]


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

    An older backup of an exactly-once pipeline is replayed through on the next run: every batch its sinks hold
    beyond it runs again with the ids and end offsets the sinks recorded, and each sink skips what it holds (the
    replay rule, :mod:`streamproof.sinks.base`); a backup of another history is refused in one line. Tried as an
    operator does it by ``tests/test_replay_through.py`` (restore two batches back, new records since: every sink
    0/0/0 by both checkers) and composed with kills, restarts and other restores by ``tests/test_nemesis.py``.
    """
    checkpoint, source = Location(checkpoint), Location(source)
    if not (source / "offsets").is_dir():
        raise PipelineError(f"{source}: not a checkpoint backup (no offsets/ folder)")
    refuse_while_running(checkpoint, "restore")
    kept = None
    if checkpoint.exists():
        kept = aside(checkpoint, "replaced")
        checkpoint.rename(kept)
    source.copy_tree(checkpoint)
    return kept
