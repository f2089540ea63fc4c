"""The operator's copies of a checkpoint: ``checkpoint backup`` and ``restore``, the names a checkpoint is kept aside
under (a restore's, a recover's, a rewind's), and the run lock an operator command holds for its whole run.

Example::

    >>> backup("hdfs://nn:9000/checkpoints/orders")                                   # doctest: +SKIP
    Location('hdfs://nn:9000/checkpoints/orders.backup-20261129T010203')
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from streamproof.checkpoint.folder import Holder, RunLock
from streamproof.checkpoint.log import Checkpoint
from streamproof.errors import PipelineError
from streamproof.storage.location import Location


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
    """The checkpoints :func:`aside` named for ``why`` beside ``checkpoint``, by name: their second, then their number.
    That is the order they were made in only while none of them was deleted: :func:`aside` takes a freed name of a
    second again (the nemesis tells the copy a restore made by the name that was not there before it).

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


@contextlib.contextmanager
def held_by_command(
    checkpoint: Checkpoint, action: str, command: str, refused: Callable[[Holder], str] | None = None
) -> Iterator[RunLock]:
    """The checkpoint's run lock, held by an operator command (``command``: "checkpoint rewind") for its whole run:
    refused in one line while a pipeline (or another command) holds it, and a pipeline started meanwhile is refused
    naming the command. A lease like a run's (renewed; a command of another machine that went quiet is taken over).
    ``refused``: the refusal's line for the holder found, when the command says it otherwise.

    >>> import tempfile
    >>> from streamproof.checkpoint.folder import Holder
    >>> folder = Location(tempfile.mkdtemp())
    >>> with held_by_command(folder, "back up", "checkpoint backup"):
    ...     Holder.parse((folder / RunLock.NAME).read_text()).command
    'checkpoint backup'
    """
    lock = RunLock(Location(checkpoint), command=command)
    holder = lock.try_acquire()
    if holder is not None and refused is not None:
        raise PipelineError(refused(holder))
    if holder is not None:
        raise PipelineError(
            f"cannot {action} {checkpoint} while "
            + (f"{holder.what} runs on it" if holder.command else "a pipeline runs on it")
            + f" (pid {holder}): "
            + ("wait for it to end" if holder.command else "stop it first (SIGTERM stops it after the batch in flight)")
            + ", so that the copy is consistent"
        )
    try:
        yield lock
    finally:
        lock.__exit__()


def backup(checkpoint: Checkpoint, target: Checkpoint | None = None) -> Location:
    """Copy the checkpoint to ``target`` (default: a stamped sibling), holding its run lock meanwhile: refused while
    a pipeline runs on it, and a pipeline started during the copy is refused.

    ``checkpoint`` and ``target`` are local paths or URIs, e.g. ``backup("hdfs://nn:9000/checkpoints/orders")``.
    """
    checkpoint, target = Location(checkpoint), (Location(target) if target is not None else None)
    if not checkpoint.is_dir():
        raise PipelineError(f"{checkpoint}: no checkpoint to back up")
    target = target or checkpoint.with_name(f"{checkpoint.name}.backup-{time.strftime('%Y%m%dT%H%M%S')}")
    if target.exists():
        raise PipelineError(f"{target} exists already: choose another backup path")
    with held_by_command(checkpoint, "back up", "checkpoint backup"):  # no run starts while it is copied
        checkpoint.copy_tree(target, skip=(RunLock.NAME,))
    return target


def restore(checkpoint: Checkpoint, source: Checkpoint) -> Location | None:
    """Replace the checkpoint by the backup ``source``; the current one is kept aside (returned). The run lock is
    held throughout and carried into the new folder (:meth:`RunLock.replace_folder`): no run starts half-way.

    An older backup of an exactly-once pipeline is replayed through on the next run: every batch its sinks hold
    beyond it runs again with the ids and end offsets the sinks recorded, and each sink skips what it holds (the
    replay rule, :mod:`streamproof.sinks.base`); a backup of another history is refused in one line. Tried as an
    operator does it by ``tests/test_replay_through.py`` (restore two batches back, new records since: every sink
    0/0/0 by both checkers) and composed with kills, restarts and other restores by ``tests/test_nemesis.py``.
    """
    checkpoint, source = Location(checkpoint), Location(source)
    if not (source / "offsets").is_dir():
        raise PipelineError(f"{source}: not a checkpoint backup (no offsets/ folder)")
    with held_by_command(checkpoint, "restore", "checkpoint restore") as lock:
        kept = aside(checkpoint, "replaced") if holds_more_than_the_lock(checkpoint) else None
        lock.replace_folder(lambda staging: source.copy_tree(staging, skip=(RunLock.NAME,)), kept)
    return kept


def holds_more_than_the_lock(checkpoint: Location) -> bool:
    """Whether the folder exists with something in it besides the run lock (which an operator command creates)."""
    return checkpoint.is_dir() and any(name != RunLock.NAME for name in checkpoint.names())
