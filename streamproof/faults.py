"""Named crash points of a micro-batch, and the SIGKILL that realises them.

A crash is a SIGKILL of the pipeline's whole process group (the Python driver and the Spark JVM it
started), never a Python exception: nothing gets to clean up, flush or roll back, exactly like a power
cut or an OOM kill. The harness (:mod:`streamproof.prove`) arms one point for one batch through the
environment variable ``STREAMPROOF_CRASH_AT`` (``"<point>@<batch_id>"``) of the child it starts; sinks
call :func:`reached` at each phase and the process dies there if armed.

Points (DESIGN.md):

* ``before-sink-write``: the offset log holds the batch, nothing of it is written;
* ``mid-sink-write``: while the sink's write job runs (data files partly written, no commit);
* ``after-sink-commit``: the sink transaction is durable, Spark's ``commits/<batch>`` is not written;
* ``after-checkpoint-commit``: Spark wrote ``commits/<batch>``, and the next batch has written nothing;
* ``random``: killed from outside at a uniformly random moment (the harness does it; no hook).

Example::

    $ STREAMPROOF_CRASH_AT=after-sink-commit@3 setsid streamproof run orders.toml --available-now
    # dies by SIGKILL right after batch 3 is committed to the sink
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from streamproof.errors import ConfigError

CRASH_ENV = "STREAMPROOF_CRASH_AT"
BEFORE_SINK_WRITE = "before-sink-write"
MID_SINK_WRITE = "mid-sink-write"
AFTER_SINK_COMMIT = "after-sink-commit"
AFTER_CHECKPOINT_COMMIT = "after-checkpoint-commit"
RANDOM = "random"
NAMED_POINTS = (BEFORE_SINK_WRITE, MID_SINK_WRITE, AFTER_SINK_COMMIT, AFTER_CHECKPOINT_COMMIT)
CRASH_POINTS = (*NAMED_POINTS, RANDOM)


@dataclass(frozen=True)
class ArmedCrash:
    point: str
    batch_id: int

    def encode(self) -> str:
        return f"{self.point}@{self.batch_id}"


def parse_crash(text: str) -> ArmedCrash:
    """``"after-sink-commit@3"`` -> ``ArmedCrash("after-sink-commit", 3)``.

    >>> parse_crash("mid-sink-write@2")
    ArmedCrash(point='mid-sink-write', batch_id=2)
    """
    point, _, batch = text.partition("@")
    if point not in NAMED_POINTS or not batch.isdigit():
        raise ConfigError(
            f"{CRASH_ENV}={text!r}: expected <point>@<batch id> with point one of {', '.join(NAMED_POINTS)}"
        )
    return ArmedCrash(point, int(batch))


def armed_crash() -> ArmedCrash | None:
    """The crash armed for this process, if any. Arming requires leading a process group."""
    text = os.environ.get(CRASH_ENV)
    if not text:
        return None
    crash = parse_crash(text)
    if os.getpgrp() != os.getpid():
        # Killing a group we do not lead could take the user's shell with it.
        raise ConfigError(
            f"{CRASH_ENV} is set but this process does not lead its process group: "
            "run crash tests through `streamproof prove` (it starts the pipeline with setsid)"
        )
    return crash


def kill_own_process_group() -> None:
    """SIGKILL this process's group: the Python driver and its Spark JVM die together, now."""
    os.killpg(os.getpgrp(), signal.SIGKILL)
    time.sleep(60)  # unreachable in practice: the signal is delivered before the next bytecode


def reached(point: str, batch_id: int) -> None:
    """Hook a sink calls at each phase; kills the process group if this point is armed for this batch."""
    crash = _ARMED
    if crash is not None and crash.point == point and crash.batch_id == batch_id:
        print(f"[streamproof] crash point {point} reached in batch {batch_id}: SIGKILL", flush=True)
        kill_own_process_group()


def kill_when_write_job_runs(batch_id: int, spark_context: object) -> threading.Thread | None:
    """For ``mid-sink-write``: a watcher thread that kills the group once the write job has tasks running.

    Returns the thread (already started) when armed for this batch, else None.
    """
    crash = _ARMED
    if crash is None or crash.point != MID_SINK_WRITE or crash.batch_id != batch_id:
        return None

    def watch() -> None:
        tracker = spark_context.statusTracker()  # type: ignore[attr-defined]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for stage_id in tracker.getActiveStageIds():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None and stage.numActiveTasks > 0:
                    time.sleep(0.05)  # let the tasks open their output files
                    reached(MID_SINK_WRITE, batch_id)
            time.sleep(0.01)

    thread = threading.Thread(target=watch, name="streamproof-mid-write-crash", daemon=True)
    thread.start()
    return thread


def kill_when_batch_committed(batch_id: int, commit_file: Path) -> threading.Thread | None:
    """For ``after-checkpoint-commit``: kill the group as soon as Spark's ``commits/<batch>`` file appears.

    Spark writes it right after ``foreachBatch`` returns; the watcher polls every 2 ms, and
    :func:`batch_starting` backs it up, so the kill always lands before the next batch writes anything.
    """
    crash = _ARMED
    if crash is None or crash.point != AFTER_CHECKPOINT_COMMIT or crash.batch_id != batch_id:
        return None

    def watch() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if commit_file.exists():
                reached(AFTER_CHECKPOINT_COMMIT, batch_id)
            time.sleep(0.002)

    thread = threading.Thread(target=watch, name="streamproof-after-commit-crash", daemon=True)
    thread.start()
    return thread


def batch_starting(batch_id: int) -> None:
    """First thing a sink does in a batch: a pending ``after-checkpoint-commit`` of an earlier batch fires
    here at the latest, before this batch marks progress or writes."""
    crash = _ARMED
    if crash is not None and crash.point == AFTER_CHECKPOINT_COMMIT and crash.batch_id < batch_id:
        reached(AFTER_CHECKPOINT_COMMIT, crash.batch_id)


_ARMED: ArmedCrash | None = None


def arm_from_environment() -> ArmedCrash | None:
    """Read ``STREAMPROOF_CRASH_AT`` once, at pipeline start."""
    global _ARMED
    _ARMED = armed_crash()
    return _ARMED
