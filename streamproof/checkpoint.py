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
