"""Delta table maintenance: OPTIMIZE (compaction of small files) and VACUUM (deletion of unreferenced files).

A micro-batch pipeline writes many small files, and a batch killed mid-write leaves data files no commit
references (readers never see them; they only take space). OPTIMIZE rewrites small files into larger ones
in a new commit; VACUUM deletes files that no version within the retention window references, the
orphans of killed writes included.

Retention guard: VACUUM keeps files younger than the retention (default 168 hours, Delta's own), since a
reader or a time-travel query may still need them and a running batch's files are not committed yet. A
shorter retention needs ``allow_short_retention`` and is refused while a pipeline runs on the checkpoint.

Example::

    >>> vacuum(spark, spec, Path("tables/orders"), retention_hours=168)           # doctest: +SKIP
    VacuumResult(path='tables/orders', deleted_files=12, retention_hours=168)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote, urlparse

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from streamproof.checkpoint.copies import held_by_command
from streamproof.checkpoint.folder import Holder, RunLock
from streamproof.config import DeltaSinkSpec, PipelineSpec
from streamproof.errors import ConfigError, PipelineError, first_line
from streamproof.storage.location import Location

DEFAULT_RETENTION_HOURS = 168.0
RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"


@dataclass(frozen=True)
class VacuumResult:
    path: str
    deleted_files: int
    retention_hours: float


@dataclass(frozen=True)
class OptimizeResult:
    path: str
    files_removed: int
    files_added: int
    partitions: int = 0  # partitions compacted (0: an unpartitioned table, or nothing to compact)
    zorder_by: tuple[str, ...] = ()

    def line(self) -> str:
        """What ``streamproof maintain`` prints for it.

        >>> OptimizeResult("t", 12, 2, partitions=2, zorder_by=("customer_id",)).line()
        't: OPTIMIZE ZORDER BY (customer_id) removed 12 files, added 2, in 2 partitions'
        """
        zorder = f" ZORDER BY ({', '.join(self.zorder_by)})" if self.zorder_by else ""
        within = f", in {self.partitions} partition{'s' * (self.partitions != 1)}" if self.partitions else ""
        return f"{self.path}: OPTIMIZE{zorder} removed {self.files_removed} files, added {self.files_added}{within}"


def maintain(
    spark: SparkSession,
    spec: PipelineSpec,
    *,
    compact: bool,
    vacuum_hours: float | None,
    allow_short_retention: bool = False,
    where: str | None = None,
) -> Iterator[str]:
    """OPTIMIZE (``compact``; only the partitions ``where`` selects, Z-ordered by the sink's ``zorder_by``) each
    Delta table of the pipeline, then VACUUM each; one line per table and step done (``streamproof maintain``). A
    table not written yet is skipped, and said so. A ``where`` that no partitioned table takes is a mistake, refused
    before any VACUUM (``tests/test_maintenance.py``)."""
    check_request(
        compact=compact, vacuum_hours=vacuum_hours, allow_short_retention=allow_short_retention, where=where, spec=spec
    )
    with _held_for_a_short_vacuum(spec, vacuum_hours):  # before OPTIMIZE commits to a table
        yield from _maintained(spark, spec, compact, vacuum_hours, allow_short_retention, where)


@contextlib.contextmanager
def _held_for_a_short_vacuum(spec: PipelineSpec, vacuum_hours: float | None) -> Iterator[None]:
    """A VACUUM shorter than the default retention deletes the files of a batch being written: refused while a
    pipeline runs, and the run lock held meanwhile, so that a pipeline started during it is refused naming
    `streamproof maintain` (``tests/test_maintenance.py``). A checkpoint not made yet is not made here: a start
    would then find it empty beside the tables."""
    if vacuum_hours is None or vacuum_hours >= DEFAULT_RETENTION_HOURS or not spec.checkpoint_dir.is_dir():
        yield
        return

    def refused(holder: Holder) -> str:
        if holder.command:
            return f"{spec.checkpoint_dir} is in use by {holder.what} (pid {holder}); wait for it to end"
        return (
            f"pipeline {spec.name!r} is running (pid {holder}): a short VACUUM would delete the files of the batch "
            "it is writing; stop it first"
        )

    with held_by_command(spec.checkpoint_dir, "vacuum", "maintain", refused):
        yield


def _maintained(
    spark: SparkSession,
    spec: PipelineSpec,
    compact: bool,
    vacuum_hours: float | None,
    allow_short_retention: bool,
    where: str | None,
) -> Iterator[str]:
    written = []
    for table, layout in delta_tables_laid_out(spec):
        if DeltaTable.isDeltaTable(spark, str(table)):
            written.append((table, layout))
        else:
            yield f"{table}: not written yet, skipped"
    refusals: list[str] = []  # --where: the tables whose partition columns it does not name
    for table, layout in written if compact else []:
        if where is not None and not layout.partition_by:
            yield f"{table}: not partitioned, --where does not apply: OPTIMIZE skipped"
            continue
        try:
            done = optimize(spark, table, where=where, zorder_by=layout.zorder_by)
        except ConfigError as refused:
            refusals.append(str(refused))
            yield f"{table}: OPTIMIZE skipped: {refused}"
        else:
            yield (done if layout.partition_by else replace(done, partitions=0)).line()
    partitioned = [table for table, layout in written if layout.partition_by]
    if where is not None and refusals and len(refusals) == len(partitioned):  # no table took it: a mistake
        raise ConfigError(refusals[0])
    if vacuum_hours is None:
        return
    for table, _ in written:
        result = vacuum(spark, spec, table, retention_hours=vacuum_hours, allow_short_retention=allow_short_retention)
        yield f"{table}: VACUUM (retain {vacuum_hours:g} h) deleted {result.deleted_files} files"


def check_request(
    *,
    compact: bool,
    vacuum_hours: float | None,
    allow_short_retention: bool,
    where: str | None = None,
    spec: PipelineSpec | None = None,
) -> None:
    """Refuse a maintenance request that does nothing, or a retention too short, before Spark starts (and so before
    any table is changed); with ``spec``, also a ``--where`` for a pipeline that has no partitioned Delta table.

    >>> check_request(compact=False, vacuum_hours=None, allow_short_retention=False)
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: nothing to do: give --optimize, --vacuum HOURS or both
    >>> check_request(compact=False, vacuum_hours=200, allow_short_retention=False, where="day = '2026-11-01'")
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: --where selects the partitions --optimize compacts: add --optimize ...
    """
    if not compact and vacuum_hours is None:
        raise ConfigError("nothing to do: give --optimize, --vacuum HOURS or both")
    if where is not None and not compact:
        raise ConfigError(
            "--where selects the partitions --optimize compacts: add --optimize (VACUUM takes no --where)"
        )
    if (
        where is not None
        and spec is not None
        and not any(layout.partition_by for _, layout in delta_tables_laid_out(spec))
    ):
        raise ConfigError(
            "--where: the pipeline has no partitioned Delta table (a sink's partition_by): leave --where out to "
            "compact whole tables"
        )
    if vacuum_hours is not None:
        check_retention(vacuum_hours, allow_short_retention=allow_short_retention)


@dataclass(frozen=True)
class Layout:
    """How the pipeline file lays a table out: its partition columns, and the columns OPTIMIZE Z-orders by."""

    partition_by: tuple[str, ...] = ()
    zorder_by: tuple[str, ...] = ()


def delta_tables(spec: PipelineSpec) -> list[Location]:
    """The Delta tables a pipeline writes: its Delta sinks and its quarantine table."""
    return [table for table, _ in delta_tables_laid_out(spec)]


def delta_tables_laid_out(spec: PipelineSpec) -> list[tuple[Location, Layout]]:
    """:func:`delta_tables`, each with its :class:`Layout` (the quarantine table is not partitioned)."""
    tables = [
        (spec.resolve_path(sink.path), Layout(tuple(sink.partition_by), tuple(sink.zorder_by)))
        for sink in spec.sink_specs
        if isinstance(sink, DeltaSinkSpec)
    ]
    return [*tables, (spec.quarantine_path, Layout())]


def check_retention(retention_hours: float, *, allow_short_retention: bool) -> None:
    """Refuse a retention below Delta's default unless explicitly allowed (one line, exit 2)."""
    if retention_hours < 0:
        raise ConfigError(f"--vacuum {retention_hours:g}: the retention must be 0 hours or more")
    if retention_hours < DEFAULT_RETENTION_HOURS and not allow_short_retention:
        raise ConfigError(
            f"--vacuum {retention_hours:g}: shorter than Delta's default retention of {DEFAULT_RETENTION_HOURS:g} "
            "hours, it would delete files that readers and time travel may still use; add --allow-short-retention "
            "if no pipeline or reader needs them"
        )


def vacuum(
    spark: SparkSession, spec: PipelineSpec, table: Location, *, retention_hours: float, allow_short_retention: bool
) -> VacuumResult:
    """VACUUM one table; returns how many files it deleted (from Delta's own dry run of the same command)."""
    check_retention(retention_hours, allow_short_retention=allow_short_retention)
    _refuse_short_vacuum_while_running(spec, retention_hours)
    command = f"VACUUM delta.`{table}` RETAIN {retention_hours:g} HOURS"
    spark.conf.set(RETENTION_CHECK_CONF, str(not allow_short_retention).lower())
    try:
        deleted = spark.sql(f"{command} DRY RUN").count()
        spark.sql(command).collect()
    finally:
        spark.conf.unset(RETENTION_CHECK_CONF)
    return VacuumResult(str(table), deleted, retention_hours)


def _refuse_short_vacuum_while_running(spec: PipelineSpec, retention_hours: float) -> None:
    holder = RunLock(spec.checkpoint_dir).holder()
    if retention_hours < DEFAULT_RETENTION_HOURS and holder is not None:
        raise PipelineError(
            f"pipeline {spec.name!r} is running (pid {holder}): a short VACUUM would delete the files of the batch "
            "it is writing; stop it first"
        )


def optimize(
    spark: SparkSession, table: Location, *, where: str | None = None, zorder_by: Sequence[str] = ()
) -> OptimizeResult:
    """OPTIMIZE one table: files are compacted within each partition (Delta never mixes partitions in a file), only
    in the partitions ``where`` selects (a predicate on partition columns), Z-ordered by ``zorder_by`` if given.

    >>> optimize(spark, Location("tables/orders"), where="event_date >= '2026-11-01'").files_added  # doctest: +SKIP
    30
    """
    builder = DeltaTable.forPath(spark, str(table)).optimize()
    if where is not None:
        try:
            builder = builder.where(where)
        except Exception as error:  # Delta: a predicate on a data column, or one it cannot parse
            raise ConfigError(f"--where {where!r}: {first_line(error)}") from None
    try:
        result = builder.executeZOrderBy(*zorder_by) if zorder_by else builder.executeCompaction()
    except Exception as error:
        if where is None:
            raise
        raise ConfigError(f"--where {where!r}: {first_line(error)}") from None
    row = result.first()
    assert row is not None, "OPTIMIZE returns one row of metrics"
    metrics = row["metrics"]
    return OptimizeResult(
        str(table),
        int(metrics["numFilesRemoved"]),
        int(metrics["numFilesAdded"]),
        int(metrics["partitionsOptimized"] or 0),
        tuple(zorder_by),
    )


def unreferenced_files(spark: SparkSession, table: Path) -> list[Path]:
    """Data files in the table's folder that the current version does not reference (local tables)."""
    files = spark.read.format("delta").load(str(table)).inputFiles()
    referenced = {Path(unquote(urlparse(uri).path)).resolve() for uri in files}
    on_disk = {path.resolve() for path in table.rglob("*.parquet") if "_delta_log" not in path.parts}
    return sorted(on_disk - referenced)
