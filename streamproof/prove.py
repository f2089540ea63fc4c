"""The chaos harness: run a pipeline as a child process, SIGKILL it, restart it, drain, reconcile.

A child is ``python -m streamproof run PIPELINE --available-now`` started with ``setsid``, so that it
leads a process group holding the Python driver and the Spark JVM; a kill is ``killpg(SIGKILL)`` of that
group. The harness then restarts the child until one run drains the topic and exits 0, and finally
reconciles with the same checker as ``streamproof verify``.

Random kills are seeded and land *while batches are being written*: for each kill the harness draws
``after`` (1 to 3 committed batches of the current run) and ``phase`` (uniform in [0, 1)), waits for the
``after``-th committed-batch line, then sleeps ``phase`` times the duration of the batch just committed
before killing, i.e. at a uniformly random point of the next batch. The moments are printed, so a
failing run can be replayed with the same seed.

Example::

    >>> crashes = run_with_random_kills(Path("orders.toml"), kills=2, seed=7)   # doctest: +SKIP
    kill 1/2: run 1 after 2 committed batches, +0.61 s into batch 2 (phase 0.37): SIGKILL pgid 4242
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

from streamproof.errors import PipelineError
from streamproof.pipeline import BATCH_COMMITTED

RUN_TIMEOUT_S = 900.0
_BATCH_LINE = re.compile(r"batch (\d+) committed: (\d+) rows in, .*, ([\d.]+) s, kafka lag")


@dataclass
class Crash:
    """One SIGKILL delivered by the harness."""

    point: str
    batch_id: int
    at_s: float
    run: int
    restarted_in_s: float | None = None
    detail: str = ""
    killed_monotonic: float = field(default=0.0, repr=False)

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data.pop("killed_monotonic")
        if self.restarted_in_s is not None:
            data["restarted_in_s"] = round(self.restarted_in_s, 2)
        data["at_s"] = round(self.at_s, 2)
        return data


@dataclass
class HarnessResult:
    """What the harness saw: the crashes it caused, and the work the pipeline reported."""

    crashes: list[Crash] = field(default_factory=list)
    runs: int = 0
    rows_in: int = 0  # summed over runs: a replayed batch counts each time it ran
    batches: int = 0
    wall_s: float = 0.0
    batch_seconds: float = 0.0
    process_groups: list[int] = field(default_factory=list)  # one per child run (pgid = child pid)

    @property
    def batch_rows_per_second(self) -> float:
        """Rows per second of batch processing time (restarts and start-up excluded)."""
        return self.rows_in / self.batch_seconds if self.batch_seconds > 0 else 0.0


@dataclass
class ChildRun:
    """A pipeline child process and the lines it printed, each with its arrival time."""

    process: subprocess.Popen[str]
    started_at: float
    log_path: Path
    lines: queue.Queue[tuple[float, str | None]] = field(default_factory=queue.Queue)
    committed: list[tuple[float, int, float]] = field(default_factory=list)  # (time, batch id, duration s)
    rows_in: int = 0
    closed_at: float | None = None

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)

    def next_line(self, timeout_s: float) -> tuple[float, str | None] | None:
        """The next (time, line); line None means the child closed its output. None on timeout."""
        if self.closed_at is not None:
            return self.closed_at, None
        try:
            at, line = self.lines.get(timeout=max(0.0, timeout_s))
        except queue.Empty:
            return None
        if line is None:
            self.closed_at = at
        return at, line


def _pump(stream: IO[str], lines: queue.Queue[tuple[float, str | None]]) -> None:
    for line in stream:
        lines.put((time.monotonic(), line.rstrip("\n")))
    lines.put((time.monotonic(), None))


def start_child(
    pipeline_file: Path,
    *,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> ChildRun:
    """Start ``streamproof run --available-now`` in its own session; stderr goes to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamproof",
                "run",
                str(pipeline_file),
                "--available-now",
                *(extra_args or []),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env=env,
        )
    child = ChildRun(process, time.monotonic(), log_path)
    assert process.stdout is not None
    threading.Thread(target=_pump, args=(process.stdout, child.lines), daemon=True).start()
    return child


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _consume(child: ChildRun, line: str, at: float, emit: Callable[[str], None]) -> None:
    emit(line)
    match = _BATCH_LINE.search(line)
    if match and BATCH_COMMITTED in line:
        child.committed.append((at, int(match.group(1)), float(match.group(3))))
        child.rows_in += int(match.group(2))


def wait_for_exit(child: ChildRun, emit: Callable[[str], None], timeout_s: float = RUN_TIMEOUT_S) -> int:
    """Forward the child's lines until it exits; kill it and raise if it outlives ``timeout_s``."""
    deadline = child.started_at + timeout_s
    while True:
        item = child.next_line(deadline - time.monotonic())
        if item is None:
            child.kill_group()
            raise PipelineError(f"pipeline run did not finish within {timeout_s:.0f} s (killed); log: {child.log_path}")
        at, line = item
        if line is None:
            break
        _consume(child, line, at, emit)
    return child.process.wait(timeout=120)


def _wait_for_batches(child: ChildRun, count: int, emit: Callable[[str], None], timeout_s: float) -> bool:
    """Forward lines until the child committed ``count`` batches in this run; False if it exited first."""
    deadline = time.monotonic() + timeout_s
    while len(child.committed) < count:
        item = child.next_line(deadline - time.monotonic())
        if item is None:
            child.kill_group()
            raise PipelineError(f"no batch committed within {timeout_s:.0f} s (killed); log: {child.log_path}")
        at, line = item
        if line is None:
            return False
        _consume(child, line, at, emit)
    return True


def _sleep_forwarding(child: ChildRun, seconds: float, emit: Callable[[str], None]) -> bool:
    """Sleep while forwarding lines; False if the child exited during the sleep."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        item = child.next_line(left)
        if item is None:
            return True
        at, line = item
        if line is None:
            return False
        _consume(child, line, at, emit)
    return child.process.poll() is None


def run_with_random_kills(
    pipeline_file: Path,
    *,
    kills: int,
    seed: int,
    log_dir: Path,
    emit: Callable[[str], None] = print,
    max_after_batches: int = 3,
    timeout_s: float = RUN_TIMEOUT_S,
) -> HarnessResult:
    """Run the pipeline to the end of its topic through ``kills`` seeded SIGKILLs.

    Raises :class:`PipelineError` if a kill could not be delivered because the pipeline drained first
    (a harness that silently skips its faults would prove nothing), or if a run fails.
    """
    rng = random.Random(seed)
    result = HarnessResult()
    crashes = result.crashes
    run_number = 0
    pending_restart: Crash | None = None
    began = time.monotonic()
    children: list[ChildRun] = []
    try:
        while True:
            run_number += 1
            child = start_child(pipeline_file, log_path=log_dir / f"run-{run_number}.log")
            children.append(child)
            if _one_run(child, run_number, rng, kills, max_after_batches, crashes, pending_restart, emit, timeout_s):
                return result
            pending_restart = crashes[-1]
    finally:
        for child in children:
            if child.process.poll() is None:
                child.kill_group()
        result.runs = len(children)
        result.process_groups = [child.process.pid for child in children]
        result.rows_in = sum(child.rows_in for child in children)
        result.batches = sum(len(child.committed) for child in children)
        result.batch_seconds = sum(duration for child in children for _, _, duration in child.committed)
        result.wall_s = time.monotonic() - began


def _one_run(
    child: ChildRun,
    run_number: int,
    rng: random.Random,
    kills: int,
    max_after_batches: int,
    crashes: list[Crash],
    pending_restart: Crash | None,
    emit: Callable[[str], None],
    timeout_s: float,
) -> bool:
    """Drive one child: kill it if kills remain (False), else wait for it to drain (True)."""
    if pending_restart is not None:
        _note_restart(child, pending_restart, emit, timeout_s)
    if len(crashes) < kills:
        after = rng.randint(1, max_after_batches)
        phase = rng.random()
        if not _wait_for_batches(child, after, emit, timeout_s):
            raise PipelineError(
                f"kill {len(crashes) + 1}/{kills} missed: run {run_number} drained before committing "
                f"{after} batches; use more data or a smaller source.max_offsets_per_trigger"
            )
        _, waited_batch, waited_duration = child.committed[-1]
        delay = phase * max(waited_duration, 0.2)
        if not _sleep_forwarding(child, delay, emit):
            raise PipelineError(
                f"kill {len(crashes) + 1}/{kills} missed: run {run_number} drained {delay:.2f} s after "
                f"batch {waited_batch}; use more data or a smaller source.max_offsets_per_trigger"
            )
        child.kill_group()
        killed_at = time.monotonic()
        _drain_output(child, emit)  # a commit line printed just before the kill still counts
        in_flight = child.committed[-1][1] + 1
        emit(
            f"kill {len(crashes) + 1}/{kills}: run {run_number}, {delay:.2f} s after batch {waited_batch} "
            f"committed (after {after}, phase {phase:.2f}): SIGKILL pgid {child.process.pid}, "
            f"batch {in_flight} in flight"
        )
        crash = Crash(
            "random",
            in_flight,
            killed_at - child.started_at,
            run_number,
            detail=f"{delay:.2f} s after batch {waited_batch} committed",
            killed_monotonic=killed_at,
        )
        crashes.append(crash)
        return False
    code = wait_for_exit(child, emit, timeout_s)
    if code != 0:
        raise PipelineError(
            f"pipeline run {run_number} exited with code {code}; last lines of {child.log_path}:\n"
            f"{_log_tail(child.log_path)}"
        )
    return True


def _drain_output(child: ChildRun, emit: Callable[[str], None], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (item := child.next_line(deadline - time.monotonic())) is not None and item[1] is not None:
        _consume(child, item[1], item[0], emit)


def surviving_processes(process_groups: list[int]) -> list[int]:
    """Pids of live processes still in any of the given process groups (expected: none)."""
    groups, alive = set(process_groups), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) in groups:
            alive.append(int(stat.parent.name))
    return alive


def _note_restart(child: ChildRun, crash: Crash, emit: Callable[[str], None], timeout_s: float) -> None:
    """Record seconds from the kill to the first batch the restarted run committed."""
    if _wait_for_batches(child, 1, emit, timeout_s):
        crash.restarted_in_s = child.committed[0][0] - crash.killed_monotonic
    else:
        crash.restarted_in_s = time.monotonic() - crash.killed_monotonic
