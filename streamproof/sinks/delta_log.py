"""A Delta table's log as streamproof reads it without Spark: which batches of a pipeline the table holds, its
latest version, and what is left past its last commit after storage went backwards.

Every keyed commit streamproof makes carries ``userMetadata = {"streamproof": {"pipeline", "batch_id",
"end_offsets"}}`` and a SetTransaction ``(appId = "streamproof/<pipeline>", version = batch id)`` in the same
atomic commit file ``_delta_log/<version>.json``. The commit files are read here as JSON (no Spark job; a local
table with no JVM at all), so the harness can look right after a SIGKILL, and the sink decides a replay from the
commits themselves (:func:`batches_back_to`), reading only the newest ones.

Example::

    >>> import json, tempfile
    >>> table = Location(tempfile.mkdtemp())
    >>> record = {"streamproof": {"pipeline": "orders", "batch_id": 4, "end_offsets": {"orders": {"0": 90}}}}
    >>> commit = [{"txn": {"appId": "streamproof/orders", "version": 4}},
    ...           {"commitInfo": {"userMetadata": json.dumps(record)}}]
    >>> (table / "_delta_log" / f"{7:020d}.json").write_text("\\n".join(json.dumps(action) for action in commit))
    >>> found = batches_back_to(table, "orders", 7, first_batch=4)
    >>> found.commits[4].end_offsets, found.complete
    ({'orders': {'0': 90}}, True)
    >>> batches_back_to(table, "orders", 7, first_batch=3).complete  # version 6 is gone: batch 3 may be older
    False
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from streamproof.errors import PipelineError
from streamproof.sinks.base import SinkCommit
from streamproof.storage.location import Location

_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(?:\.(\d+)\.(\d+))?(?:\.[0-9a-fA-F-]{36})?\.(?:parquet|json)")
_BY_VERSION = re.compile(r"(?:\d{20}\.)?(\d{20})\.(?:json|crc|compacted\.json|checkpoint\..*)")


def app_id(pipeline: str, *, after_restore: int | None = None) -> str:
    """Delta SetTransaction appId of a pipeline: stable across restarts of the same pipeline. ``after_restore``: the
    version of a RESTORE that undid commits of the pipeline. Delta keeps its record of the transactions the undone
    commits carried, and skips a write whose transaction version is not above the one recorded for its appId (a MERGE,
    its writer): the batches replayed after that RESTORE are committed under an appId of their own.

    >>> app_id("orders"), app_id("orders", after_restore=5)
    ('streamproof/orders', 'streamproof/orders@5')
    """
    return f"streamproof/{pipeline}" if after_restore is None else f"streamproof/{pipeline}@{after_restore}"


def is_app_of(app: object, pipeline: str) -> bool:
    """Whether a SetTransaction's appId is one of the pipeline's (:func:`app_id`; a pipeline's name has no ``@``)."""
    return isinstance(app, str) and (app == app_id(pipeline) or app.startswith(app_id(pipeline) + "@"))


def commit_file(table: Location, version: int) -> Location:
    """The commit file of ``version`` in the table's log."""
    return table / "_delta_log" / f"{version:020d}.json"


def pipeline_commit(text: str, pipeline: str) -> SinkCommit | None:
    """The batch of ``pipeline`` one commit file records (None: a commit of something else), and whether it carries
    the pipeline's SetTransaction for that batch (keyed).

    >>> pipeline_commit('{"commitInfo": {"operation": "OPTIMIZE"}}', "orders") is None
    True
    """
    txn_versions, record = set(), None
    for line in text.splitlines():
        if '"txn"' not in line and '"commitInfo"' not in line:
            continue  # add / remove / metaData actions: nothing of the batch key in them
        action = json.loads(line)
        if "txn" in action and is_app_of(action["txn"].get("appId"), pipeline):
            txn_versions.add(int(action["txn"]["version"]))
        elif "commitInfo" in action:
            metadata = json.loads(action["commitInfo"].get("userMetadata") or "{}").get("streamproof") or {}
            if metadata.get("pipeline") == pipeline:
                record = metadata
    if record is None:
        return None
    batch_id = int(record["batch_id"])
    return SinkCommit(
        batch_id,
        record["end_offsets"],
        batch_id in txn_versions,
        quarantined=record.get("quarantined"),
        start_offsets=record.get("start_offsets"),
    )


def commits_on_disk(table: Location, pipeline: str) -> list[dict[str, Any]]:
    """Every commit of ``pipeline`` the table holds (those a RESTORE undid left out): ``{"version", "batch_id",
    "end_offsets", "txn"}``, oldest first. Reads every commit file: for the harness and the start checks, not for a
    batch's decision (:func:`batches_back_to` reads the newest only)."""
    versions = _commit_versions((table / "_delta_log").names())
    commits: list[dict[str, Any]] = []
    try:
        for version, text in in_effect(table, max(versions, default=-1), min(versions, default=0), []):
            commit = pipeline_commit(text, pipeline)
            if commit is not None:
                commits.append(
                    {
                        "version": version,
                        "batch_id": commit.batch_id,
                        "end_offsets": commit.end_offsets,
                        "txn": commit.keyed,
                    }
                )
    except FileNotFoundError:
        pass  # a gap: the older commit files were cleaned up behind a Delta checkpoint
    return commits[::-1]


def other_writers(table: Location, pipeline: str) -> list[str]:
    """The commits in effect that changed the table's rows and are not ``pipeline``'s (another process appended,
    deleted, updated or merged), oldest first, each as ``version V OPERATION``; maintenance (OPTIMIZE, VACUUM: no
    data change) is not one. Reads every commit file: for ``verify``, whose counts then include those writers' rows
    (an appended row is unexpected, a deleted one lost), and says so.

    >>> import tempfile
    >>> table = Location(tempfile.mkdtemp())
    >>> commit_file(table, 0).write_text('{"commitInfo": {"operation": "OPTIMIZE"}}\\n{"add": {"dataChange": false}}')
    >>> commit_file(table, 1).write_text('{"commitInfo": {"operation": "DELETE"}}\\n{"remove": {"dataChange": true}}')
    >>> other_writers(table, "orders")
    ['version 1 DELETE']
    """
    versions = _commit_versions((table / "_delta_log").names())
    found = []
    try:
        for version, text in in_effect(table, max(versions, default=-1), min(versions, default=0), []):
            if pipeline_commit(text, pipeline) is not None or '"dataChange":true' not in text.replace(" ", ""):
                continue
            info: dict[str, Any] = next(
                (json.loads(line)["commitInfo"] for line in text.splitlines() if '"commitInfo"' in line), {}
            )
            found.append(f"version {version} {info.get('operation', 'a commit')}")
    except FileNotFoundError:
        pass  # older commit files cleaned up behind a Delta checkpoint: what they did is no longer told
    return found[::-1]


@dataclass(frozen=True)
class Restore:
    """A RESTORE commit (Delta's ``RESTORE TABLE``, delta-rs's ``DeltaTable.restore``): committed as ``version``, it
    brought the table back to its state at ``to``, undoing every commit in between (their files removed; the commit
    files stay in the log, and Delta's record of the transactions they carried too)."""

    version: int
    to: int

    @property
    def undid(self) -> str:
        """The versions it undid, in words.

        >>> Restore(9, 1).undid
        'versions 2-8'
        """
        first, last = self.to + 1, self.version - 1
        return f"version {first}" if first == last else f"versions {first}-{last}"

    def __str__(self) -> str:
        """What it did, as the refusals name it.

        >>> str(Restore(9, 1))
        'a RESTORE committed as version 9 brought it back to version 1, undoing versions 2-8'
        """
        back = f"a RESTORE committed as version {self.version} brought it back to version {self.to}"
        return f"{back}, undoing {self.undid}"


def restore_of(text: str, version: int) -> Restore | None:
    """The RESTORE one commit file (of ``version``) records (None: another operation); :class:`PipelineError` for a
    RESTORE whose commit does not say to which version.

    >>> restore_of('{"commitInfo": {"operation": "RESTORE", "operationParameters": {"version": "1"}}}', 5)
    Restore(version=5, to=1)
    >>> restore_of('{"commitInfo": {"operation": "WRITE"}}', 5) is None
    True
    >>> try:
    ...     restore_of('{"commitInfo": {"operation": "RESTORE", "operationParameters": {"timestamp": "2026"}}}', 5)
    ... except PipelineError as refused:
    ...     print(str(refused)[:60])
    version 5 of the table is a RESTORE whose commit does not na
    """
    if '"RESTORE"' not in text:
        return None  # every commit file a walk reads passes here: no JSON parsed for the usual ones
    for line in text.splitlines():
        if '"commitInfo"' not in line:
            continue
        info = json.loads(line).get("commitInfo") or {}
        if info.get("operation") != "RESTORE":
            return None
        to = (info.get("operationParameters") or {}).get("version")
        try:
            return Restore(version, int(str(to)))
        except (TypeError, ValueError):
            raise PipelineError(
                f"version {version} of the table is a RESTORE whose commit does not name the version it restored "
                f"(operationParameters {json.dumps(info.get('operationParameters'))}), so which of the pipeline's "
                "batches it undid cannot be told: restore by version (RESTORE TABLE ... TO VERSION AS OF n)"
            ) from None
    return None


def in_effect(table: Location, newest: int, oldest: int, restores: list[Restore]) -> Iterator[tuple[int, str]]:
    """``(version, commit file text)`` of the commits in effect as of ``newest``, newest first, down to ``oldest``:
    the commits a RESTORE undid are passed over (a commit's file stays in the log after a RESTORE removed its data,
    so a batch in it is no longer held). Each RESTORE met is appended to ``restores``; one whose ``to`` is below
    ``oldest`` ends the walk (what lies below was read before, and the caller must read it again). A commit file
    that is gone raises :class:`FileNotFoundError` (cleaned up behind a Delta checkpoint).

    >>> import tempfile
    >>> table, met = Location(tempfile.mkdtemp()), []
    >>> for version in range(4):
    ...     commit_file(table, version).write_text('{"commitInfo": {"operation": "WRITE"}}')
    >>> restore = {"commitInfo": {"operation": "RESTORE", "operationParameters": {"version": 1}}}
    >>> commit_file(table, 4).write_text(json.dumps(restore))
    >>> [version for version, _ in in_effect(table, 4, 0, met)], met
    ([1, 0], [Restore(version=4, to=1)])
    """
    version = newest
    while version >= oldest:
        text = commit_file(table, version).read_text()
        restore = restore_of(text, version)
        if restore is None:
            yield version, text
            version -= 1
            continue
        restores.append(restore)
        version = min(restore.to, version - 1)  # a RESTORE is to an earlier version; never loop on a malformed one


def latest_version(table: Location, *, known: int = -1, known_present: bool = False) -> int:
    """The table's latest version (-1: no table), without listing its log: forward from ``known`` (a version this
    process saw) or from Delta's ``_last_checkpoint`` pointer over the commit files that exist, a few existence
    checks (Delta numbers its commits without a gap). The whole log is listed only when neither start has its
    commit file: a table without a Delta checkpoint yet (young: its log is short), or storage that lost commits.

    >>> import tempfile
    >>> table = Location(tempfile.mkdtemp())
    >>> for version in range(5):
    ...     commit_file(table, version).write_text("{}")
    >>> latest_version(table), latest_version(table, known=3), latest_version(Location(tempfile.mkdtemp()))
    (4, 4, -1)
    """
    if known >= 0 and (known_present or commit_file(table, known).is_file()):  # present: the caller just saw it
        return _last_commit_from(table, known)
    return look_at_log(table).latest


@dataclass(frozen=True)
class LogLook:
    """One look at a Delta table's log (:func:`look_at_log`): its latest version, Delta's checkpoint pointer (-1: none;
    None: torn), and the log's listing when the look needed one (a young table, a log that lost commits)."""

    latest: int
    pointer: int | None
    names: tuple[str, ...] | None = None


def look_at_log(table: Location) -> LogLook:
    """The table's latest version as :func:`latest_version` finds it without a version seen before, with what it read
    on the way, so that the look for files past the last commit (:func:`log_past_its_commits`) reads none of it again.

    >>> import tempfile
    >>> table = Location(tempfile.mkdtemp())
    >>> commit_file(table, 0).write_text("{}")
    >>> look_at_log(table)
    LogLook(latest=0, pointer=-1, names=('00000000000000000000.json',))
    """
    pointer = checkpoint_pointer(table)
    if pointer is not None and pointer >= 0 and commit_file(table, pointer).is_file():
        return LogLook(_last_commit_from(table, pointer), pointer)
    log = table / "_delta_log"
    if pointer == -1 and log.is_remote and not log.exists():  # no table yet: listing it throws (checkpoint_pointer)
        return LogLook(-1, -1, ())
    names = tuple(sorted(log.names()))
    return LogLook(max(_commit_versions(set(names)), default=-1), pointer, names)


def checkpoint_pointer(table: Location) -> int | None:
    """The version Delta's ``_last_checkpoint`` points at: -1 when there is none, None when it is unreadable (torn)."""
    pointer_file = table / "_delta_log" / "_last_checkpoint"
    # A young table has none. Read from a store, a missing file is a Java exception, which crosses Py4J through
    # PySpark's and Delta's converters: about 300 round trips, 0.06 s warm, 0.2 s in a first batch on HDFS (its 6 looks
    # made 1.3 s). Asking first whether the file is there throws nothing: one RPC on HDFS, one HEAD on S3. 3 alternated
    # pairs on HDFS, this and look_at_log's: first batch 11.08 -> 9.51 s (medians; docs/performance.md).
    if pointer_file.is_remote and not pointer_file.is_file():
        return -1
    try:
        pointer = json.loads(pointer_file.read_text())
        return int(pointer["version"])
    except FileNotFoundError:
        return -1
    except (ValueError, KeyError, TypeError):
        return None


def _last_commit_from(table: Location, start: int) -> int:
    """The last of the contiguous commit files from ``start`` (which exists): galloping, then halving, so
    ``k`` commits past ``start`` cost about ``2 log2 k`` existence checks (two when none)."""
    found, step = start, 1
    while commit_file(table, found + step).is_file():
        found, step = found + step, step * 2
    missing = found + step
    while missing - found > 1:
        middle = (found + missing) // 2
        found, missing = (middle, missing) if commit_file(table, middle).is_file() else (found, middle)
    return found


def _commit_versions(names: list[str] | set[str]) -> set[int]:
    """The versions of the commit files among a log's ``names``."""
    return {int(match[1]) for name in names if (match := _COMMIT.fullmatch(name))}


def newest_commit(
    table: Location, pipeline: str, newest: int | None = None, *, oldest: int = 0, restores: list[Restore] | None = None
) -> SinkCommit | None:
    """The newest commit of ``pipeline`` in the table (None: none in the commit files from ``oldest`` on), read
    newest first from version ``newest`` (default: the latest): other writers' commits after it are read past, the
    older ones never, and so are the commits a RESTORE undid (:func:`in_effect`; each RESTORE met is appended to
    ``restores``).

    >>> newest_commit(Location("/data/orders"), "orders")                                  # doctest: +SKIP
    SinkCommit(batch_id=41, end_offsets={'orders': {'0': 90210}}, keyed=True, complete=True, quarantined=0)
    """
    newest = latest_version(table) if newest is None else newest
    try:
        for _, text in in_effect(table, newest, oldest, [] if restores is None else restores):
            if (commit := pipeline_commit(text, pipeline)) is not None:
                return commit
    except FileNotFoundError:
        return None  # cleaned up behind a Delta checkpoint: the commit files hold none of the pipeline's
    return None


@dataclass
class BatchesFound:
    """The commits of a pipeline :func:`batches_back_to` found, by batch id, and whether they are all of those it
    looked for (``complete``): False when a commit file it needed is gone (log clean-up behind a Delta checkpoint)
    before it reached a batch older than the first it looked for."""

    commits: dict[int, SinkCommit] = field(default_factory=dict)
    complete: bool = True
    read: int = 0  # commit files read
    restores: list[Restore] = field(default_factory=list)  # the RESTOREs met, newest first (:func:`in_effect`)


def batches_back_to(table: Location, pipeline: str, newest: int, first_batch: int, *, oldest: int = 0) -> BatchesFound:
    """The batches of ``pipeline`` with ids ``>= first_batch`` that the table holds as of version ``newest``, read
    from its commit files newest first, down to version ``oldest`` (the versions below it were read before).

    Bounded by what it looks for, not by the table's age: streamproof writes a batch only when its id is higher than
    every batch of the pipeline the table holds (:func:`streamproof.sinks.base.replay_decision`), so the pipeline's
    batch ids grow along the log, and the scan stops at the commit of ``first_batch`` or of an older batch. Commits
    of other writers (OPTIMIZE, another pipeline) are read past; for a pipeline's first batch (``first_batch`` 0 or
    less) the caller asks Delta's own state first, rather than reading a foreign table's whole log.
    """
    found = BatchesFound()
    try:
        for _, text in in_effect(table, newest, oldest, found.restores):
            found.read += 1
            commit = pipeline_commit(text, pipeline)
            if commit is None:
                continue
            if commit.batch_id < first_batch:
                return found
            found.commits.setdefault(commit.batch_id, commit)  # the newest commit of a batch id is what a reader sees
            if commit.batch_id == first_batch:
                return found  # every older commit holds an older batch: nothing more to look for
    except FileNotFoundError:
        found.complete = False
    return found


@dataclass(frozen=True)
class LogPastItsCommits:
    """A Delta log whose trailing commit files are gone while files of those versions stayed: a checkpoint (Delta
    then fails every read and write: "Could not find any delta files for version N"), a checksum, the
    ``_last_checkpoint`` pointer.

    ``stranded``: those files (names in ``_delta_log``); ``needs``: commit files a read back to ``last_commit``
    still needs that are gone too (empty: setting the stranded files aside makes the table readable again, at
    ``last_commit``).
    """

    table: Location
    last_commit: int
    stranded: tuple[str, ...]
    needs: tuple[str, ...]


def log_past_its_commits(
    table: Location, *, thorough: bool = False, look: LogLook | None = None
) -> LogPastItsCommits | None:
    """What a Delta table's log holds past its last commit file, or None when nothing. The sound log, the usual
    case, is told without a listing by the traces a lost commit leaves (:func:`_nothing_past`), as every start
    checks; ``thorough`` lists the whole log whatever (for the repairs, which run rarely and must find every file).
    ``look``: a look at the log just made (:func:`look_at_log`), whose listing, or pointer, is not read again.

    >>> log_past_its_commits(Location("/data/orders"))                               # doctest: +SKIP
    LogPastItsCommits(table=..., last_commit=9, stranded=('00000000000000000010.checkpoint.parquet', ...), needs=())
    """
    log = table / "_delta_log"
    if thorough:
        look = None
    elif look is None:
        look = look_at_log(table)
    if look is not None and look.names is None and _nothing_past(table, look.latest, look.pointer):
        return None
    # Something may be past the last commit: the whole answer needs the whole listing (a young log's look has it).
    names = set(look.names if look is not None and look.names is not None else log.names())
    commits = _commit_versions(names)
    last = max(commits, default=-1)
    stranded = {name for name in names if (version := _version_of(name)) is not None and version > last}
    pointer = look.pointer if look is not None else checkpoint_pointer(table)
    if pointer is not None and pointer > last:  # torn (None): Delta itself lists the log then; nothing stranded by it
        stranded |= {"_last_checkpoint"} | ({"._last_checkpoint.crc"} & names)
    if not stranded:
        return None
    parts: dict[int, set[int]] = {}
    complete = set()
    for name in names:
        if (match := _CHECKPOINT.fullmatch(name)) and int(match[1]) <= last:
            if match[2] is None:
                complete.add(int(match[1]))
            else:
                parts.setdefault(int(match[1]), set()).add(int(match[2]))
                if len(parts[int(match[1])]) == int(match[3]):
                    complete.add(int(match[1]))
    base = max(complete, default=-1)
    lost_through = max((version for name in stranded if (version := _version_of(name)) is not None), default=last)
    needs = [f"{version:020d}.json" for version in range(base + 1, last + 1) if version not in commits]
    if last < 0:  # no commit file at all: only the lost ones could bring the table back
        needs = [f"{version:020d}.json" for version in range(0, lost_through + 1)]
    return LogPastItsCommits(table, last, tuple(sorted(stranded)), tuple(needs))


# What is written beside a commit of the same version (Delta's checksum and a classic checkpoint, Hadoop's hidden
# checksums of the commit and of Delta's): left past the last commit when storage lost the newest commits.
_BESIDE_A_COMMIT = ("{v}.crc", "{v}.checkpoint.parquet", ".{v}.json.crc", ".{v}.crc.crc")
# Checkpoint intervals whose next checkpoint is looked for: Delta's default and streamproof's for new tables.
_INTERVALS = (10, 100)


def _nothing_past(table: Location, last: int, pointer: int | None) -> bool:
    """Nothing of a version past ``last`` is in the log, by the traces a lost newest commit leaves: the checkpoint
    pointer past it, a file of the next version, or a checkpoint at the next multiple of a usual interval; a dozen
    existence checks. (A multi-part or UUID-named checkpoint has its pointer. A loss that left none of these
    traces is found by Delta's own read, which then fails, and by ``checkpoint rewind``, which lists the log.)"""
    if pointer is not None and pointer > last:
        return False
    log = table / "_delta_log"
    versions = [last + 1, *((last // interval + 1) * interval for interval in _INTERVALS)]
    candidates = {name.format(v=f"{version:020d}") for name in _BESIDE_A_COMMIT for version in versions}
    return not any((log / name).is_file() for name in sorted(candidates))


def _version_of(name: str) -> int | None:
    """The version a log file belongs to (a compacted file: its last), Hadoop's hidden checksum of it alike."""
    if name.startswith(".") and name.endswith(".crc"):
        name = name[1:-4]
    match = _BY_VERSION.fullmatch(name)
    return int(match[1]) if match else None


def set_aside_stranded(past: LogPastItsCommits, into: Location) -> list[str]:
    """Move the files of lost versions out of the log into ``into`` (created), so Delta reads the table at its last
    commit; returns their new paths. Nothing is deleted."""
    into.mkdir()
    moved = []
    for name in past.stranded:
        (past.table / "_delta_log" / name).rename(into / name)
        moved.append(str(into / name))
    return moved
