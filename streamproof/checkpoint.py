"""Read Spark's streaming checkpoint: the offset log (written before a batch runs) and the commit log
(written after it succeeds).

Invariant used everywhere in streamproof: batch N is *in flight* when ``offsets/N`` exists and
``commits/N`` does not; on restart Spark re-runs exactly that offset range with the same batch id.

Example::

    >>> logged_batches(".streamproof/checkpoints/orders")      # doctest: +SKIP
    [0, 1, 2, 3]
    >>> committed_batches(".streamproof/checkpoints/orders")   # doctest: +SKIP
    [0, 1, 2]
"""

from __future__ import annotations

import json
from pathlib import Path

from streamproof.errors import PipelineError


def _batch_files(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(f.name) for f in folder.iterdir() if f.name.isdigit())


def logged_batches(checkpoint: str | Path) -> list[int]:
    """Batch ids present in the offset log."""
    return _batch_files(Path(checkpoint) / "offsets")


def committed_batches(checkpoint: str | Path) -> list[int]:
    """Batch ids present in the commit log."""
    return _batch_files(Path(checkpoint) / "commits")


def is_empty(checkpoint: str | Path) -> bool:
    """True when no batch was ever planned in this checkpoint (a fresh or lost checkpoint)."""
    return not logged_batches(checkpoint)


def batch_end_offsets(checkpoint: str | Path, batch_id: int) -> dict[str, dict[str, int]]:
    """End offsets of a batch as logged by Spark: ``{topic: {partition: offset}}`` of the first source.

    The file is ``v1``, one line of batch metadata, then one JSON line per source.
    """
    path = Path(checkpoint) / "offsets" / str(batch_id)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PipelineError(f"{path}: no offset log entry for batch {batch_id}") from None
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise PipelineError(f"{path}: offset log entry is truncated or not Spark's format")
    try:
        offsets = json.loads(lines[2])
    except json.JSONDecodeError as error:
        raise PipelineError(f"{path}: offset log entry is not valid JSON ({error})") from None
    return {topic: {str(p): int(o) for p, o in parts.items()} for topic, parts in offsets.items()}


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
        import os

        temporary = self.path.with_suffix(".tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"batch_id": batch_id, "end_offsets": end_offsets}, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)

    def wipe_spark_logs(self) -> None:
        """Delete Spark's logs in the checkpoint (not the progress): the next start replays nothing."""
        import shutil

        if not self.checkpoint.exists():
            return
        for entry in self.checkpoint.iterdir():
            if entry.name == self.NAME:
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def next_batch_to_run(checkpoint: str | Path) -> int:
    """The batch id a (re)start of the query will execute first.

    The batch logged but not committed (replayed), else the one after the last committed, else 0.

    >>> next_batch_to_run("/nonexistent")
    0
    """
    logged, committed = logged_batches(checkpoint), committed_batches(checkpoint)
    if logged and logged[-1] not in committed:
        return logged[-1]
    return committed[-1] + 1 if committed else 0
