"""The checkpoint's run lock: one live process at a time on a pipeline, stale locks taken over exactly once.

Real processes (no Spark): a holder that is alive, dead, or exited and not yet reaped; one on another host; and many
processes that find the same stale lock at the same moment. A lock file that exists but cannot be read is refused,
never taken over; on HDFS (Hadoop's FileSystem stood in for, no JVM) only a file that is not there means no holder.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from py4j.protocol import Py4JError, Py4JJavaError

from streamproof.checkpoint.folder import Holder, RunLock
from streamproof.errors import PipelineError
from streamproof.storage.location import Location, conflict_to_retry, refused_as_existing


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_a_live_holder_is_refused_in_one_line_and_a_dead_one_is_taken_over(tmp_path: Path) -> None:
    checkpoint = Location(tmp_path)
    live = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / RunLock.NAME).write_text(f"{live.pid}@{socket.gethostname()}")
        with pytest.raises(PipelineError) as refused:
            RunLock(checkpoint).__enter__()
        assert str(refused.value) == f"{tmp_path} is in use by a running pipeline (pid {live.pid}); stop it first"
    finally:
        live.kill()
        live.wait()
    (tmp_path / RunLock.NAME).write_text(str(_dead_pid()))  # an older lock: a bare pid, of this host
    with RunLock(checkpoint) as lock:
        written = Holder.parse((tmp_path / RunLock.NAME).read_text())
        assert written is not None and (written.pid, written.host) == (os.getpid(), socket.gethostname())
        assert written == lock.mine and written.epoch == 1 and written.lease_s > 0
    assert not (tmp_path / RunLock.NAME).exists()


def test_a_holder_killed_and_not_yet_reaped_counts_as_gone(tmp_path: Path) -> None:
    zombie = subprocess.Popen(["sleep", "60"])
    try:
        zombie.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed process did not become a zombie"
            time.sleep(0.01)
        os.kill(zombie.pid, 0)  # the pid still answers: only its state tells it is gone
        assert not Holder(zombie.pid, socket.gethostname()).alive()
        (tmp_path / RunLock.NAME).write_text(f"{zombie.pid}@{socket.gethostname()}")
        assert RunLock(Location(tmp_path)).try_acquire() is None
    finally:
        zombie.wait()


def test_a_lock_from_another_host_is_never_taken_over(tmp_path: Path) -> None:
    lock = tmp_path / RunLock.NAME
    lock.write_text(f"{_dead_pid()}@elsewhere-{socket.gethostname()}")
    with pytest.raises(PipelineError, match=r"\(pid \d+ on host elsewhere-.*\); stop it first \(not checked from here: "
                                            r"if it is gone, delete .*_streamproof_run\.pid\)"):  # fmt: skip
        RunLock(Location(tmp_path)).__enter__()
    assert lock.read_text().startswith(str(Holder.parse(lock.read_text()).pid))  # type: ignore[union-attr]


def _contend(folder: str, start_at: float, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    while time.time() < start_at:
        pass
    holder = RunLock(Location(folder)).try_acquire()
    results.put((os.getpid(), holder is None))
    if holder is None:
        time.sleep(0.5)  # hold it while the others look


def test_many_processes_finding_one_stale_lock_at_once_leave_exactly_one_holder(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    for trial in range(10):
        folder = tmp_path / str(trial)
        folder.mkdir()
        (folder / RunLock.NAME).write_text(str(_dead_pid()))
        results = context.Queue()
        start_at = time.time() + 0.3
        processes = [context.Process(target=_contend, args=(str(folder), start_at, results)) for _ in range(6)]
        for process in processes:
            process.start()
        outcomes = [results.get(timeout=30) for _ in processes]
        for process in processes:
            process.join(30)
        winners = [pid for pid, won in outcomes if won]
        assert len(winners) == 1, f"trial {trial}: {len(winners)} processes hold the lock"


UNREADABLE = "the run lock exists but {problem} after 5 reads in 0.2 s; it is not taken over: if no pipeline runs on "


@pytest.mark.parametrize(
    ("case", "problem"),
    [
        ("folder", "cannot be read (Is a directory)"),  # what a read of a folder raises, on every store
        ("io-error", "cannot be read (Input/output error)"),
        ("empty", "names no process ('')"),  # half-created, and it stays so
    ],
)
def test_a_lock_file_that_exists_but_cannot_be_read_is_refused_in_one_line_and_never_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, problem: str
) -> None:
    monkeypatch.setattr(RunLock, "READ_PAUSE_S", 0.05)
    lock = tmp_path / RunLock.NAME
    if case == "folder":
        lock.mkdir()
    else:
        lock.write_text("" if case == "empty" else "4242@elsewhere")  # its content is never read (io-error)
    if case == "io-error":
        read_text = Location.read_text

        def failing(self: Location) -> str:
            if self.name == RunLock.NAME:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return read_text(self)

        monkeypatch.setattr(Location, "read_text", failing)
    before = lock.read_text() if lock.is_file() else None
    with pytest.raises(PipelineError) as refused:
        RunLock(Location(tmp_path)).__enter__()
    assert str(refused.value) == f"{lock}: {UNREADABLE.format(problem=problem)}{tmp_path}, delete it"
    assert lock.exists() and (lock.is_dir() if case == "folder" else lock.read_text() == before)
    with pytest.raises(PipelineError, match="the run lock exists but"):  # a backup or restore is refused alike
        RunLock(Location(tmp_path)).holder()


def test_a_lock_file_being_written_is_read_again_and_its_live_holder_refused(tmp_path: Path) -> None:
    lock = tmp_path / RunLock.NAME
    lock.write_text("")  # as a writer that creates, then writes, leaves it for a moment
    live = subprocess.Popen(["sleep", "60"])
    writer = threading.Timer(0.3, lambda: lock.write_text(f"{live.pid}@{socket.gethostname()}"))
    try:
        writer.start()
        holder = RunLock(Location(tmp_path)).try_acquire()
        assert holder == Holder(live.pid, socket.gethostname())
        assert lock.read_text() == f"{live.pid}@{socket.gethostname()}"
    finally:
        writer.join()
        live.kill()
        live.wait()


class _JavaError(Py4JJavaError):
    def __str__(self) -> str:  # the real one asks the JVM for the Java trace
        return f"Py4JJavaError: {self.java_exception.getClass().getName()}"


class _JavaClass:
    def __init__(self, names: list[str]) -> None:
        self.names = names

    def getName(self) -> str:  # noqa: N802 - Java's name
        return self.names[0]

    def getSuperclass(self) -> _JavaClass | None:  # noqa: N802 - Java's name
        return _JavaClass(self.names[1:]) if len(self.names) > 1 else None


class _JavaException:
    """A Java exception as Py4J hands it over: its class (and superclasses) and message."""

    _target_id = "o1"

    def __init__(self, *names: str, message: str = "", status: int | None = None,
                 cause: _JavaException | None = None) -> None:  # fmt: skip
        self.names = [*names, "java.lang.Exception", "java.lang.Throwable", "java.lang.Object"]
        self.message, self.status, self.cause = message, status, cause

    def getCause(self) -> _JavaException | None:  # noqa: N802 - Java's name
        return self.cause

    def statusCode(self) -> int:  # noqa: N802 - the AWS SDK's name
        if self.status is None:
            raise Py4JError("Method statusCode([]) does not exist")  # what Py4J raises for a method the object lacks
        return self.status

    def getClass(self) -> _JavaClass:  # noqa: N802 - Java's name
        return _JavaClass(self.names)

    def getMessage(self) -> str:  # noqa: N802 - Java's name
        return self.message


NOT_FOUND = ("java.io.FileNotFoundException", "java.io.IOException")


class _FileSystem:
    """Hadoop's FileSystem as a remote run lock meets it: the file exists when asked, then fails on open."""

    def __init__(self, raises: _JavaException, folder: bool = False) -> None:
        self.raises, self.folder = raises, folder

    def exists(self, path: object) -> bool:
        return True

    def open(self, path: object) -> object:
        raise _JavaError("An error occurred while calling o7.open", self.raises)

    def getFileStatus(self, path: object) -> object:  # noqa: N802 - Java's name
        if not self.folder:
            raise _JavaError("An error occurred while calling o7.getFileStatus", _JavaException(*NOT_FOUND))
        return type("Status", (), {"isDirectory": lambda self: True})()


def _remote(fs: _FileSystem) -> Location:
    location = Location(f"hdfs://namenode:9000/checkpoints/orders/{RunLock.NAME}")
    location.__dict__.update(_fs=fs, _jpath=object(), _jvm=object())  # Hadoop's side, without a JVM
    return location


@pytest.mark.parametrize(
    ("raised", "folder", "python"),
    [
        (_JavaException(*NOT_FOUND, message="File does not exist: /checkpoints/orders/x"), False, FileNotFoundError),
        (_JavaException(*NOT_FOUND, message="Path is not a file: /checkpoints/orders/x"), True, IsADirectoryError),
        (_JavaException("org.apache.hadoop.security.AccessControlException", "java.io.IOException"), False,
         PermissionError),
        (_JavaException("java.io.EOFException", "java.io.IOException"), False, OSError),
    ],
)  # fmt: skip
def test_a_remote_read_raises_pythons_error_for_hadoops(raised: _JavaException, folder: bool, python: type) -> None:
    with pytest.raises(python) as error:
        _remote(_FileSystem(raised, folder)).read_text()
    assert type(error.value) is python
    assert str(error.value).startswith(f"hdfs://namenode:9000/checkpoints/orders/{RunLock.NAME}: {raised.names[0]}")


def test_a_remote_lock_deleted_between_exists_and_open_means_no_holder() -> None:
    lock = _remote(_FileSystem(_JavaException(*NOT_FOUND, message="File does not exist")))
    run_lock = RunLock(lock.parent)
    run_lock.path = lock
    assert run_lock.holder() is None
    with pytest.raises(_JavaError):  # an error that is not of I/O stays what it is
        _remote(_FileSystem(_JavaException("java.lang.IllegalStateException"))).read_text()


S3_EXCEPTION = "software.amazon.awssdk.services.s3.model.S3Exception"


class _PrintedJavaError(Py4JJavaError):
    def __str__(self) -> str:  # as Py4J prints it: the call (its object's id), then the Java class and message
        return f"{self.errmsg}.\n: {self.java_exception.getClass().getName()}: {self.java_exception.getMessage()}"


def test_a_lost_conditional_create_is_known_by_its_class_or_status_never_by_numbers_in_its_text() -> None:
    """A 412 is S3A's RemoteFileChangedException, or a cause whose HTTP status is 412; a 409 (two conditional writes
    in flight) is one to try again. Numbers in a Py4J call's object id or in a path say nothing: an error that read as
    "the object exists" because its text held "412" made a failed write pass for a lost race."""
    numbers = _PrintedJavaError("An error occurred while calling o1412.close", _JavaException(
        "java.io.IOException", message="s3a://bucket/checkpoint/commits/1412: connection reset"))
    assert "412" in str(numbers) and not refused_as_existing(numbers) and not conflict_to_retry(numbers)
    exists = _PrintedJavaError("An error occurred while calling o7.close", _JavaException(
        "org.apache.hadoop.fs.s3a.RemoteFileChangedException", "java.io.IOException", message="PUT: precondition"))
    status = _PrintedJavaError("An error occurred while calling o7.close", _JavaException(
        "java.io.IOException", cause=_JavaException(S3_EXCEPTION, status=412)))
    conflict = _PrintedJavaError("An error occurred while calling o7.close", _JavaException(
        "java.io.IOException", cause=_JavaException(S3_EXCEPTION, status=409)))
    assert refused_as_existing(exists) and refused_as_existing(status)
    assert not refused_as_existing(conflict)
    assert conflict_to_retry(conflict) and not conflict_to_retry(status)


def test_a_command_that_lost_its_lease_while_paused_changes_nothing_and_leaves_the_new_holders_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `checkpoint restore` (or recover) whose lease was taken over from another machine while it was paused: its
    swap of the folders is refused in one line, the checkpoint and the new holder's lock are left as they are, and
    nothing is put aside."""
    from dataclasses import replace

    from streamproof.checkpoint.copies import held_by_command
    from streamproof.checkpoint.folder import LEASE_ENV

    monkeypatch.setenv(LEASE_ENV, "1.5")  # renewed every 0.5 s
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    taker = replace(Holder.me(lease_s=1.5), holder="the-new-holder", machine="another-machine", epoch=2)
    with held_by_command(Location(checkpoint), "restore", "checkpoint restore") as lock:
        (checkpoint / RunLock.NAME).write_text(taker.to_text())  # taken over meanwhile, as from another machine
        time.sleep(1.2)  # the command's next renewal finds it
        with pytest.raises(PipelineError, match=r"^this run lost its lease to pid \d+ on host .* \(epoch 2\)"):
            lock.replace_folder(lambda staging: staging.mkdir(), Location(tmp_path / "kept"))
    assert (checkpoint / "offsets").is_dir() and not (tmp_path / "kept").exists()
    assert Holder.parse((checkpoint / RunLock.NAME).read_text()) == taker
