"""The checkpoint's run lock: one live process at a time on a pipeline, stale locks taken over exactly once.

Real processes (no Spark): a holder that is alive, dead, or exited and not yet reaped; one on another host; and many
processes that find the same stale lock at the same moment.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from streamproof.checkpoint.folder import Holder, RunLock
from streamproof.errors import PipelineError
from streamproof.storage import Location


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
    with RunLock(checkpoint):
        assert (tmp_path / RunLock.NAME).read_text() == f"{os.getpid()}@{socket.gethostname()}"
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
