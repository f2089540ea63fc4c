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
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from streamproof.errors import PipelineError, first_line
from streamproof.faults.points import process_info
from streamproof.storage.location import CONDITIONAL_SCHEMES, Location


class ProgressFile:
    """At-most-once progress: the end offsets of the last batch marked done *before* it was written.

    Kept beside Spark's logs in the checkpoint folder; every start of an at-most-once pipeline wipes Spark's logs (so
    nothing is replayed) and starts reading from these offsets.

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


LEASE_ENV = "STREAMPROOF_LEASE_S"
# A takeover after a crash on another machine waits this long, plus LEASE_GRACE_S; a holder that cannot renew for it
# stops. 10 s stopped the cluster test's run when its one DataNode restarted for 1 s: HDFS's client backs off reading
# a block after a refused connection (1.4 s, then 4.7 s here), and the renewal took more than 9 s.
DEFAULT_LEASE_S = 30.0
RENEW_RETRY_S = 1.0  # a renewal that failed is tried again after this, not a third of the lease later
LEASE_GRACE_S = 1.0  # a taker waits the lease and this much more: a renewal written at the lease's last moment counts


def lease_seconds() -> float:
    """The run lock's lease (``$STREAMPROOF_LEASE_S``, else :data:`DEFAULT_LEASE_S`): how long a holder of another
    machine may go without renewing before it is taken over.

    >>> lease_seconds() > 0
    True
    """
    return float(os.environ.get(LEASE_ENV) or DEFAULT_LEASE_S)


def this_machine() -> str:
    """Where a pid names one process: this kernel's boot and this PID namespace. Two containers with one hostname,
    or a process in a namespace of its own, are other machines for the run lock: their pids mean nothing here.

    >>> this_machine() == this_machine()
    True
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return socket.gethostname()
    return f"{boot}/{namespace}"


def _process_started(pid: int) -> int:
    """The process's start time (clock ticks after boot; 0 when unknown): a pid reused later is another process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


@dataclass(frozen=True)
class Holder:
    """The run named in a run lock. A lease lock (JSON) names a random id, its host, pid and machine for people and
    liveness, an epoch raised by each takeover and its lease; an older lock holds ``pid@host`` (a bare pid: this
    host), never renewed. Shown as the pid, with the host when it is another machine's.

    >>> Holder.parse("4242@worker-7") == Holder(4242, "worker-7")
    True
    >>> str(Holder(4242, "worker-7")), Holder.parse("oops")
    ('4242 on host worker-7', None)
    >>> mine = Holder.me(lease_s=10.0)
    >>> Holder.parse(mine.to_text()) == mine and mine.here
    True
    """

    pid: int
    host: str
    holder: str = ""  # a random id, new for each run (lease locks)
    machine: str = ""  # :func:`this_machine` of the holder
    started: int = 0  # the holder's start time (:func:`_process_started`)
    epoch: int = 0  # raised by each takeover
    lease_s: float = 0.0  # 0: an older lock, never renewed
    renewals: int = 0
    renewed_at: float = 0.0  # wall clock, for people
    command: str = ""  # an operator command holding it ("checkpoint rewind"); "" for a pipeline run

    @classmethod
    def me(cls, *, lease_s: float = 0.0, epoch: int = 1, command: str = "") -> Holder:
        pid = os.getpid()
        if not lease_s:
            return cls(pid, socket.gethostname())
        return cls(pid, socket.gethostname(), uuid.uuid4().hex, this_machine(), _process_started(pid), epoch,
                   lease_s, 0, time.time(), command)  # fmt: skip

    @property
    def what(self) -> str:
        """What holds it, for a refusal: ``a running pipeline`` or the operator command.

        >>> Holder(4242, "h").what, Holder(4242, "h", command="checkpoint rewind").what
        ('a running pipeline', '`streamproof checkpoint rewind`')
        """
        return f"`streamproof {self.command}`" if self.command else "a running pipeline"

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        if text.lstrip().startswith("{"):
            try:
                return cls(**json.loads(text))
            except (json.JSONDecodeError, TypeError):
                return None
        pid, _, host = text.strip().partition("@")
        try:
            return cls(int(pid), host or socket.gethostname())
        except ValueError:
            return None

    def to_text(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def here(self) -> bool:
        """Whether its pid can be checked from here: the same machine and PID namespace (an older lock: the same
        hostname)."""
        return self.machine == this_machine() if self.machine else self.host == socket.gethostname()

    @property
    def is_this_process(self) -> bool:
        return self.here and self.pid == os.getpid()

    def alive(self) -> bool:
        """Whether the process runs. One of another machine is taken to: its liveness cannot be checked from here
        (its lease can: :meth:`RunLock.try_acquire`)."""
        if not self.here:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        if self.started and _process_started(self.pid) != self.started:
            return False  # the pid names another process now
        return process_state(self.pid) not in ("Z", None)  # a killed process its parent has not reaped yet: gone

    def __str__(self) -> str:
        return str(self.pid) if self.here else f"{self.pid} on host {self.host}"


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``Z``: exited, not reaped), None when there is no such process."""
    info = process_info(pid)
    return info.state if info is not None else None


class RunLock:
    """``<checkpoint>/_streamproof_run.pid`` while a pipeline runs on the checkpoint: a lease. A second run, a backup or
    a restore is refused while its holder lives.

    - The file is created only if absent (atomically, on HDFS and S3 too), so two starts cannot both hold it.
    - The holder renews its lease every third of it (:data:`DEFAULT_LEASE_S`) from a thread of its own, after reading
      that the file still names it. On S3 the renewal is written over the version read only (If-Match): a takeover
      from another machine between the read and the write is refused by the store, never overwritten
      (``tests/test_s3.py::test_a_lease_renewal_on_s3_that_a_takeover_overtook_is_refused_by_the_store``); on HDFS
      it sets the file's time, and the renewal reads the file again after it.
    - A holder of this machine and PID namespace is judged by its pid (and the pid's start time); a dead one is taken
      over at once. One of another machine, or of another PID namespace with the same hostname, is taken over when
      its lease was not renewed for the lease plus :data:`LEASE_GRACE_S`, as watched from here; never while it renews.
      An older ``pid@host`` lock of another host is never renewed, so it is refused until its file is removed.
    - Each takeover raises the epoch. A run that lost its lease (taken over, or not renewed in time: paused, cut off)
      stops at its next :meth:`check`, which the batch path calls before each write and before Spark's commit; its
      exit deletes the file only while it names this run.
    - A file that exists but cannot be read is refused, never taken over.

    Example::

        >>> import tempfile
        >>> with RunLock(Location(tempfile.mkdtemp())) as lock:
        ...     lock.holder() is None    # this process holds it: another one would be refused
        True
    """

    NAME = "_streamproof_run.pid"
    READS = 5  # an unreadable lock file is read this many times, READ_PAUSE_S apart, before it is refused
    READ_PAUSE_S = 0.2
    WATCH_PAUSE_S = 0.1  # how often a taker looks at a lease it waits out

    # The locks this process holds, by file: a run inside an operator command of the same process (the replays of
    # `checkpoint rewind`) joins the command's lock instead of taking it as its own and deleting it when it ends.
    _held_here: dict[str, RunLock] = {}

    def __init__(self, checkpoint: Location, lease_s: float | None = None, *, command: str = "") -> None:
        self.path = checkpoint / self.NAME
        self.lease_s = lease_s if lease_s is not None else lease_seconds()
        self.command = command
        self.mine: Holder | None = None
        self._joined: RunLock | None = None
        self._lost: Holder | None = None
        self._lost_at = 0.0
        self._valid_until = 0.0  # monotonic: past it, this run no longer trusts its lease
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def holder(self) -> Holder | None:
        """The live process (other than this one) holding the lock, else None (:meth:`_written_holder`: a lock file
        that exists but cannot be read is refused, never taken for "no holder"). One of another machine counts as
        live: only waiting out its lease tells otherwise (:meth:`try_acquire`)."""
        holder = self._written_holder()
        if holder is None or self._is_mine(holder) or not holder.alive():
            return None
        return holder

    def _is_mine(self, holder: Holder) -> bool:
        return holder.is_this_process or (self.mine is not None and holder.holder == self.mine.holder != "")

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
                if not self._renewed_by_touch:
                    return holder
                try:  # the time itself, not the newer of it and the text's: a touch always changes what is read
                    status = self.path.status()
                except Exception as error:  # noqa: BLE001 - the NameNode away a moment: read again, as above
                    problem = f"cannot be read ({first_line(error)})"
                    continue
                return replace(holder, renewed_at=status[1] / 1000) if status is not None else holder
            problem = f"names no process ({text.strip()[:40]!r})"
        raise PipelineError(
            f"{self.path}: the run lock exists but {problem} after {self.READS} reads in "
            f"{(self.READS - 1) * self.READ_PAUSE_S:.1f} s; it is not taken over: if no pipeline runs on "
            f"{self.path.parent}, delete it"
        )

    def try_acquire(self, *, wait_out_leases: bool = True) -> Holder | None:
        """Take the lock, taking over a stale one (its process gone, or its lease not renewed: watched for up to the
        lease plus :data:`LEASE_GRACE_S` when ``wait_out_leases``); returns None when taken (and renewed from then
        on), else the live holder."""
        if (host := RunLock._held_here.get(str(self.path))) is not None and host is not self:
            self._joined = host  # held by this process already: this one renews nothing and deletes nothing
            return None
        for _ in range(5):
            started = time.monotonic()
            mine = Holder.me(lease_s=self.lease_s, command=self.command)
            if self.path.create_new(mine.to_text()):
                self._hold(mine, started)
                return None
            written = self._written_holder()
            if written is None:
                continue  # released in between: try to create it again
            if self._is_mine(written):
                return None
            if written.here:
                if written.alive():
                    return written
                why = f"its process {written.pid} is gone"
            elif not written.lease_s or not wait_out_leases:
                return written  # an older pid@host lock of another host is never renewed: never judged stale
            else:
                # Watched without the host's mutex: a holder of this host renews under it.
                waited = self._wait_out(written)
                if waited is None:
                    now = self._written_holder()
                    if now is not None and now.holder == written.holder:
                        return now  # it renewed its lease: it lives
                    continue  # released or taken by another: look again
                why = f"its lease of {written.lease_s:g} s was not renewed for {waited:.1f} s"
            with _host_mutex(self.path):
                conditional = self.path.scheme in CONDITIONAL_SCHEMES
                tag = self.path.version_tag() if conditional else None
                if self._written_holder() != written or (conditional and tag is None):
                    continue  # renewed or taken in between (on S3: no version to write over, gone)
                # Stale. The file exists, so no start can create it, and no process of this host deletes it while
                # this one holds the mutex. On S3 the takeover is written over the version read (If-Match): a renewal
                # from another machine landing after that read makes the store refuse it (``tests/test_s3.py::
                # test_a_takeover_on_s3_that_a_renewal_overtook_is_refused_by_the_store``). Elsewhere the stale file
                # is deleted, then created: a renewal written in that instant is deleted, and its holder finds the
                # lock taken at its next renewal and stops before its next commit.
                started = time.monotonic()
                taker = Holder.me(lease_s=self.lease_s, epoch=written.epoch + 1, command=self.command)
                if tag is not None:
                    taken = self.path.replace_if_unchanged(taker.to_text(), tag)
                else:
                    self.path.delete()
                    taken = self.path.create_new(taker.to_text())
                if taken:
                    took_over = f"took over the run lock of {self.path.parent} from pid {written} (epoch {taker.epoch})"
                    print(f"[streamproof] {took_over}: {why}", file=sys.stderr, flush=True)
                    self._hold(taker, started)
                    return None
        raise PipelineError(f"{self.path}: other processes kept taking and leaving the run lock; try again")

    def _wait_out(self, written: Holder) -> float | None:
        """Watch ``written``'s lease from here; the seconds it went unrenewed, or None when the file changed (renewed,
        released or taken)."""
        first_seen = time.monotonic()
        while (waited := time.monotonic() - first_seen) < written.lease_s + LEASE_GRACE_S:
            time.sleep(self.WATCH_PAUSE_S)
            if self._written_holder() != written:
                return None
        return waited

    def _hold(self, mine: Holder, started: float) -> None:
        self.mine, self._lost = mine, None
        RunLock._held_here[str(self.path)] = self
        self._valid_until = started + self.lease_s - LEASE_GRACE_S
        self._stop.clear()
        self._keeper = threading.Thread(target=self._keep, name="streamproof-lease", daemon=True)
        self._keeper.start()

    @property
    def _renewed_by_touch(self) -> bool:
        """HDFS (no conditional write; a client sets a file's times, which object stores ignore): the lease renewed by
        the file's time, never a rewrite that could land over a taker's lock; read as ``renewed_at``."""
        return self.path.scheme == "hdfs"

    def _keep(self) -> None:
        """Renew the lease every third of it, while the file names this run; note a loss and stop when it does not."""
        pause = self.lease_s / 3
        while not self._stop.wait(pause):
            started, pause = time.monotonic(), RENEW_RETRY_S  # a failed renewal is tried again soon
            try:
                with _host_mutex(self.path):
                    # On S3 the renewal is written over the version read (If-Match): a takeover from another machine
                    # between the read and the write makes the store refuse it, not the renewal overwrite the taker.
                    tag = self.path.version_tag() if self.path.scheme in CONDITIONAL_SCHEMES else None
                    written = self._written_holder()
                    assert self.mine is not None
                    if written is None or written.holder != self.mine.holder:
                        self._lost, self._lost_at = written, time.time()
                        return
                    renewed = replace(self.mine, renewals=self.mine.renewals + 1, renewed_at=time.time())
                    if self._renewed_by_touch:
                        self.path.touch()
                        now = self._written_holder()  # the time touched may be a taker's file: then it is lost
                        if now is None or now.holder != self.mine.holder:
                            self._lost, self._lost_at = now, time.time()
                            return
                    elif tag is None:
                        self.path.replace_with_text(renewed.to_text())
                    elif not self.path.replace_if_unchanged(renewed.to_text(), tag):
                        self._lost, self._lost_at = self._written_holder(), time.time()
                        return
                    self.mine = renewed
                    self._valid_until = started + self.lease_s - LEASE_GRACE_S
                    pause = self.lease_s / 3
            except (OSError, PipelineError) as error:  # the store away for a moment: check() stops the run in time
                print(f"[streamproof] renewing the run lock {self.path} failed ({error}); retrying",
                      file=sys.stderr, flush=True)  # fmt: skip

    @property
    def holder_id(self) -> str:
        """The random id of the lease this run holds (the command's when it joined one), for a store that fences
        older holders off (:meth:`streamproof.sinks.base.Sink.fence`); "" when it holds none.

        >>> import tempfile
        >>> with RunLock(Location(tempfile.mkdtemp())) as lock:
        ...     len(lock.holder_id)
        32
        """
        if self._joined is not None:
            return self._joined.holder_id
        return self.mine.holder if self.mine is not None else ""

    def check(self) -> None:
        """Raise :class:`PipelineError` when this run no longer holds its lease (taken over, or not renewed within
        it): called before each durable write of a batch, so a run that lost it stops before its next commit.

        >>> import tempfile
        >>> with RunLock(Location(tempfile.mkdtemp())) as lock:
        ...     lock.check()
        """
        if self._joined is not None:
            return self._joined.check()
        if self.mine is None or (self._lost is None and time.monotonic() < self._valid_until):
            return
        holder = self._lost
        if holder is None:
            try:
                written = self._written_holder()
            except PipelineError:
                written = None
            if written is not None and written.holder == self.mine.holder:
                raise PipelineError(
                    f"this run could not renew its lease on {self.path} within {self.lease_s:g} s (paused, or the "
                    "store was away): it stops before its next commit; start it again"
                )
            holder = written
        at = time.strftime("%H:%M:%S", time.localtime(holder.renewed_at if holder else self._lost_at or time.time()))
        to = f"pid {holder} (epoch {holder.epoch})" if holder is not None else "nobody (its file was removed)"
        raise PipelineError(f"this run lost its lease to {to} at {at}: it stops before its next commit")

    def replace_folder(self, fill: Callable[[Location], None], kept: Location | None) -> None:
        """Put a new checkpoint folder in place of the one this lock is in, the lock carried over so that no start
        finds the folder unlocked: ``fill`` writes the new folder (a backup's copy, a rebuilt log) at a sibling
        name, this run's lock file is created in it, then, under the host's mutex (the renewals wait), the old folder
        goes to ``kept`` (or is deleted when None) and the new one takes its name. A start that slipped into the
        instant between the two moves made the name exist again: the second move fails and says so; nothing of the
        old folder is lost (it is at ``kept``)."""
        assert self.mine is not None, "replace_folder needs the lock held"
        folder = self.path.parent
        staging = folder.with_name(f".{folder.name}.new-{uuid.uuid4().hex[:8]}")
        fill(staging)
        if not (staging / self.NAME).create_new(self.mine.to_text()):
            raise PipelineError(f"{staging}: its run lock could not be created (it exists already)")
        with _host_mutex(self.path):
            self.check()  # a command paused past its lease and taken over swaps nothing under the new holder
            if kept is not None:
                folder.rename(kept)
                (kept / self.NAME).delete()
            elif folder.exists():
                folder.delete(recursive=True)
            try:
                staging.rename(folder)
            except (OSError, PipelineError) as error:
                raise PipelineError(
                    f"{folder} was created again while it was being replaced (a pipeline started?): {error}; the "
                    f"new checkpoint is at {staging}" + (f", the previous one at {kept}" if kept else "")
                ) from None

    def __enter__(self) -> RunLock:
        holder = self.try_acquire()
        if holder is not None:
            hint = (
                "" if holder.here or holder.lease_s else f" (not checked from here: if it is gone, delete {self.path})"
            )
            then = "wait for it to end" if holder.command else "stop it first"
            raise PipelineError(f"{self.path.parent} is in use by {holder.what} (pid {holder}); {then}{hint}")
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop renewing; delete the file only while it names this run (after a takeover it is the new holder's)."""
        if self._joined is not None:
            self._joined = None
            return
        if RunLock._held_here.get(str(self.path)) is self:
            del RunLock._held_here[str(self.path)]
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        with _host_mutex(self.path):
            try:
                written = self._written_holder()
            except PipelineError:
                return
            if written is not None and self._is_mine(written):
                self.path.delete()
        self.mine = None


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
