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

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from streamproof.checkpoint.folder import RunLock
from streamproof.config import DeltaSinkSpec, PipelineSpec
from streamproof.errors import ConfigError, PipelineError
from streamproof.storage import Location

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


def maintain(spark: SparkSession, spec: PipelineSpec, *, compact: bool, vacuum_hours: float | None,
             allow_short_retention: bool = False) -> Iterator[str]:  # fmt: skip
    """OPTIMIZE (``compact``) and/or VACUUM each Delta table of the pipeline; one line per table and step done
    (``streamproof maintain``). A table not written yet is skipped, and said so."""
    check_request(compact=compact, vacuum_hours=vacuum_hours, allow_short_retention=allow_short_retention)
    for table in delta_tables(spec):
        if not DeltaTable.isDeltaTable(spark, str(table)):
            yield f"{table}: not written yet, skipped"
            continue
        if compact:
            done = optimize(spark, table)
            yield f"{table}: OPTIMIZE removed {done.files_removed} files, added {done.files_added}"
        if vacuum_hours is not None:
            result = vacuum(spark, spec, table, retention_hours=vacuum_hours,
                            allow_short_retention=allow_short_retention)  # fmt: skip
            yield f"{table}: VACUUM (retain {vacuum_hours:g} h) deleted {result.deleted_files} files"


def check_request(*, compact: bool, vacuum_hours: float | None, allow_short_retention: bool) -> None:
    """Refuse a maintenance request that does nothing, or a retention too short, before Spark starts.

    >>> check_request(compact=False, vacuum_hours=None, allow_short_retention=False)
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: nothing to do: give --optimize, --vacuum HOURS or both
    """
    if not compact and vacuum_hours is None:
        raise ConfigError("nothing to do: give --optimize, --vacuum HOURS or both")
    if vacuum_hours is not None:
        check_retention(vacuum_hours, allow_short_retention=allow_short_retention)


def delta_tables(spec: PipelineSpec) -> list[Location]:
    """The Delta tables a pipeline writes: its Delta sinks and its quarantine table."""
    tables = [spec.resolve_path(sink.path) for sink in spec.sink_specs if isinstance(sink, DeltaSinkSpec)]
    return [*tables, spec.quarantine_path]


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
    holder = RunLock(spec.checkpoint_dir).holder()
    if retention_hours < DEFAULT_RETENTION_HOURS and holder is not None:
        raise PipelineError(
            f"pipeline {spec.name!r} is running (pid {holder}): a short VACUUM would delete the files of the batch "
            "it is writing; stop it first"
        )
    command = f"VACUUM delta.`{table}` RETAIN {retention_hours:g} HOURS"
    spark.conf.set(RETENTION_CHECK_CONF, str(not allow_short_retention).lower())
    try:
        deleted = spark.sql(f"{command} DRY RUN").count()
        spark.sql(command).collect()
    finally:
        spark.conf.unset(RETENTION_CHECK_CONF)
    return VacuumResult(str(table), deleted, retention_hours)


def optimize(spark: SparkSession, table: Location) -> OptimizeResult:
    """OPTIMIZE (bin-packing compaction) one table."""
    row = DeltaTable.forPath(spark, str(table)).optimize().executeCompaction().first()
    assert row is not None, "OPTIMIZE returns one row of metrics"
    metrics = row["metrics"]
    return OptimizeResult(str(table), int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"]))


def unreferenced_files(spark: SparkSession, table: Path) -> list[Path]:
    """Data files in the table's folder that the current version does not reference (local tables)."""
    files = spark.read.format("delta").load(str(table)).inputFiles()
    referenced = {Path(unquote(urlparse(uri).path)).resolve() for uri in files}
    on_disk = {path.resolve() for path in table.rglob("*.parquet") if "_delta_log" not in path.parts}
    return sorted(on_disk - referenced)
