"""The checkpoint folder as streamproof looks after it: the run lock, at-most-once's progress file, and whole
copies (backup, restore). Spark's own logs in it are read by :mod:`streamproof.checkpoint.log`.

streamproof's own files in the folder start with ``_streamproof`` (Spark ignores them; an at-most-once start,
which wipes Spark's logs, keeps them).

Example::

    >>> import tempfile
    >>> checkpoint = Path(tempfile.mkdtemp()) / "orders"
    >>> with RunLock(checkpoint):
    ...     RunLock(checkpoint).holder() is None   # this process holds it; another one would be refused
    True
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from streamproof.errors import PipelineError


class ProgressFile:
    """At-most-once progress: the end offsets of the last batch marked done *before* it was written.

    Kept beside Spark's logs in the checkpoint folder; every start of an at-most-once pipeline wipes
    Spark's logs (so nothing is replayed) and starts reading from these offsets.

    Example::

        >>> progress = ProgressFile(Path("/tmp/cp"))                  # doctest: +SKIP
        >>> progress.mark_done({"orders": {"0": 120, "1": 98}})     # doctest: +SKIP
        >>> progress.starting_offsets()                              # doctest: +SKIP
        '{"orders": {"0": 120, "1": 98}}'
    """

    NAME = "_streamproof_progress.json"

    def __init__(self, checkpoint: Path) -> None:
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
        """Durably record the batch as done (write, fsync, atomic rename)."""
        temporary = self.path.with_suffix(".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"batch_id": batch_id, "end_offsets": end_offsets}, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)

    def wipe_spark_logs(self) -> None:
        """Delete Spark's logs in the checkpoint (not the progress): the next start replays nothing."""
        if not self.checkpoint.exists():
            return
        for entry in self.checkpoint.iterdir():
            if entry.name.startswith("_streamproof"):  # this progress, the run lock, the run counter
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()


class RunLock:
    """``<checkpoint>/_streamproof_run.pid`` while a pipeline runs on the checkpoint: a second run, a
    backup or a restore is refused while the process that holds it is alive (a stale file is ignored).

    Example::

        >>> with RunLock(Path(".streamproof/checkpoints/orders")):   # doctest: +SKIP
        ...     run_the_query()
    """

    NAME = "_streamproof_run.pid"

    def __init__(self, checkpoint: Path) -> None:
        self.path = checkpoint / self.NAME

    def holder(self) -> int | None:
        """Pid of a live process holding the lock, else None."""
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
        holder = self.holder()
        if holder is not None:
            raise PipelineError(f"{self.path.parent} is in use by a running pipeline (pid {holder}); stop it first")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(str(os.getpid()))
        return self

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)


def refuse_while_running(checkpoint: Path, action: str) -> None:
    holder = RunLock(checkpoint).holder()
    if holder is not None:
        raise PipelineError(
            f"cannot {action} {checkpoint} while a pipeline runs on it (pid {holder}): stop it first (SIGTERM "
            "stops it after the batch in flight), so that the copy is consistent"
        )


def backup(checkpoint: Path, target: Path | None = None) -> Path:
    """Copy the checkpoint (not while a pipeline runs on it) to ``target`` (default: a stamped sibling)."""
    if not checkpoint.is_dir():
        raise PipelineError(f"{checkpoint}: no checkpoint to back up")
    refuse_while_running(checkpoint, "back up")
    target = target or checkpoint.with_name(f"{checkpoint.name}.backup-{time.strftime('%Y%m%dT%H%M%S')}")
    if target.exists():
        raise PipelineError(f"{target} exists already: choose another backup path")
    shutil.copytree(checkpoint, target, ignore=shutil.ignore_patterns(RunLock.NAME))
    return target


def restore(checkpoint: Path, source: Path) -> Path | None:
    """Replace the checkpoint by the backup ``source``; the current one is kept aside (returned).

    Restoring an older backup is safe with streamproof's sinks: the batches the sinks hold beyond it are
    replayed with the same ids and offsets, and each keyed sink skips them.
    """
    if not (source / "offsets").is_dir():
        raise PipelineError(f"{source}: not a checkpoint backup (no offsets/ folder)")
    refuse_while_running(checkpoint, "restore")
    aside = None
    if checkpoint.exists():
        aside = checkpoint.with_name(f"{checkpoint.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}")
        checkpoint.rename(aside)
    shutil.copytree(source, checkpoint)
    return aside
