"""A long nemesis paused between two steps and carried on later (``prove --nemesis N``, then ``prove
--nemesis-resume FOLDER``).

Hundreds of steps take hours: on a Kafka cluster of three nodes on 2 cores a step takes 30 to 80 s. The first SIGINT
or SIGTERM lets the step in progress end, its repairs included, then writes what the nemesis knows into
:data:`STATE_FILE` beside its pipelines (the sequence and the next step, the topic, the backups, the counts and the
history) and exits 3: nothing is judged yet. A second signal aborts at once.

Between the pause and the resume the servers may be stopped, and started again from the same state folder
(``streamproof infra up``). The resume refuses another set of servers in one line: a step that found no server to
fault would be skipped, not run. It takes the state file (renamed ``nemesis.json.resumed-<time>``), so a resumed
nemesis that dies uncleanly cannot be resumed a second time from a state it has already changed.

Example::

    >>> import signal
    >>> with PauseOnSignal() as pause:
    ...     signal.raise_signal(signal.SIGTERM)
    ...     pause.requested()
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

from pyspark.sql import SparkSession

from streamproof.errors import ConfigError
from streamproof.harness.crashes import Emit
from streamproof.harness.daemons import Daemons
from streamproof.harness.nemesis import Nemesis
from streamproof.harness.sequence import Sequence, parse_sequence
from streamproof.kafka_client import topic_exists
from streamproof.storage.location import Location

STATE_FILE = "nemesis.json"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class PauseOnSignal:
    """While open, the first SIGINT or SIGTERM asks for a pause (:meth:`requested`, said on stderr); the second
    raises ``KeyboardInterrupt``. The handlers before it are put back when it closes. Only this process's: the
    nemesis's own JVM ignores SIGINT, but a SIGTERM sent to its whole process group would stop it too."""

    def __init__(self) -> None:
        self._signal: str | None = None
        self._before: dict[int, Any] = {}

    def __enter__(self) -> PauseOnSignal:
        self._before = {number: signal.signal(number, self._on_signal) for number in _SIGNALS}
        return self

    def __exit__(self, *_: object) -> None:
        for number, handler in self._before.items():
            signal.signal(number, handler)

    def requested(self) -> bool:
        return self._signal is not None

    def _on_signal(self, number: int, _frame: FrameType | None) -> None:
        if self._signal is not None:
            raise KeyboardInterrupt(f"{signal.Signals(number).name} again: the nemesis aborted")
        self._signal = signal.Signals(number).name
        # A raw write: the main thread may be inside a print, and Python's buffered streams are not reentrant.
        os.write(2, f"pausing after the step in progress ({self._signal}); a second signal aborts at once\n".encode())


def save_paused(nemesis: Nemesis, sequence: Sequence, next_step: int, servers: list[str]) -> Path:
    """Write what ``nemesis`` knows, paused before ``sequence``'s step ``next_step`` (0-based); return the file."""
    state = {
        "pipeline": str(nemesis.pipeline_file.resolve()),
        "pipeline_sha256": _digest(nemesis.pipeline_file),
        "sequence": sequence.encode(),
        "next_step": next_step,
        "servers": servers,
        "data_seed": nemesis.data_seed,
        "label": nemesis.label,
        "stamp": nemesis.stamp,
        "backups": [location.text for location in nemesis.backups],
        "replaced": nemesis.replaced.text if nemesis.replaced is not None else None,
        "replaced_at_run": nemesis.replaced_at_run,
        "runs": nemesis.runs,
        "produced": nemesis.produced,
        "steps_applied": nemesis.steps_applied,
        "history": nemesis.history,
        "paused_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path = nemesis.workdir / STATE_FILE
    Location(path).replace_with_text(json.dumps(state, indent=1))  # whole or not at all: a reboot may interrupt it
    return path


def resumed(
    pipeline_file: Path, folder: Path, spark: SparkSession, daemons: Daemons, emit: Emit
) -> tuple[Nemesis, Sequence, int]:
    """The nemesis paused in ``folder`` as it was, its sequence and the step to carry on from; refused in one line
    when ``folder`` holds no paused nemesis, or one of another pipeline, or other servers are up than it ran with."""
    path = folder / STATE_FILE
    if not path.is_file():
        raise ConfigError(
            f"--nemesis-resume: {folder} holds no paused nemesis (no {STATE_FILE}); give the folder a "
            "paused run printed, e.g. .streamproof/nemesis/<time>/sequence-1"
        )
    state = json.loads(path.read_text())
    if Path(state["pipeline"]) != pipeline_file.resolve():
        raise ConfigError(f"--nemesis-resume: {folder} is a nemesis of {state['pipeline']}, not of {pipeline_file}")
    digest = _digest(pipeline_file)
    if state.get("pipeline_sha256", digest) != digest:  # kept since 43966d8
        raise ConfigError(
            f"--nemesis-resume: {pipeline_file} changed since the nemesis in {folder} paused; put it "
            "back as it was, or start a new nemesis"
        )
    if state["servers"] != daemons.restartable():
        up = ", ".join(daemons.restartable()) or "none"
        raise ConfigError(
            f"--nemesis-resume: the nemesis in {folder} ran with these servers up: "
            f"{', '.join(state['servers']) or 'none'}; up now: {up}: start the same ones "
            "(streamproof infra up, with the same state folder) and resume again"
        )
    nemesis = Nemesis(
        pipeline_file, folder, spark, daemons, int(state["data_seed"]), emit, label=state["label"], stamp=state["stamp"]
    )
    bootstrap = getattr(nemesis.spec.source, "bootstrap_servers", "")
    if not topic_exists(bootstrap, nemesis.topic):
        raise ConfigError(
            f"--nemesis-resume: the nemesis's topic {nemesis.topic} is not on {bootstrap} (were the "
            "servers started on a fresh state folder, or wiped?): its records are gone, start a new "
            "nemesis"
        )
    nemesis.backups = [Location(text) for text in state["backups"]]
    nemesis.replaced = Location(state["replaced"]) if state["replaced"] is not None else None
    nemesis.replaced_at_run = int(state.get("replaced_at_run", -1))  # a state paused before it was kept: -1
    nemesis.runs, nemesis.produced = int(state["runs"]), int(state["produced"])
    nemesis.steps_applied, nemesis.history = int(state["steps_applied"]), list(state["history"])
    path.replace(path.with_name(f"{STATE_FILE}.resumed-{time.strftime('%Y%m%dT%H%M%S')}"))
    return nemesis, parse_sequence(state["sequence"]), int(state["next_step"])


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
