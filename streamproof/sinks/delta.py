"""Delta Lake sink: append, or MERGE (upsert) on a business key, keyed on the batch for exactly-once.

Idempotency rule, stated once: a keyed batch is committed with Delta's SetTransaction
``(appId = "streamproof/<pipeline>", version = <batch id>)`` and ``userMetadata = {"streamproof": {"pipeline",
"batch_id", "end_offsets"}}`` in the same atomic commit as the data; a crash before the commit leaves only
unreferenced files that readers never see. Whether a batch is written at all is decided by the replay rule of
:mod:`streamproof.sinks.base` on what the table holds: its newest commit files are read once per run, back to the
run's first batch (:func:`streamproof.sinks.delta_log.batches_back_to`), and every later decision reads only the
commits made since (by this run or anyone else), from the version of the transaction that commits the batch. A
commit a RESTORE undid is not held (:func:`streamproof.sinks.delta_log.in_effect`); a RESTORE under a running sink
that undid batches of the run stops it; the batches replayed after a RESTORE are committed under an appId marked
with it (:func:`streamproof.sinks.delta_log.app_id`). Proven by ``tests/test_other_writers.py``.

* append: the batch's files and the SetTransaction are committed through Delta's transaction API, without Delta's
  own lookup of the appId (a rebuild of the whole table state per commit); a new table, a schema-evolving write,
  or a batch whose columns are not the table's go through Delta's writer, whose schema checks refuse a column
  whose type changed;
* merge: MERGE ignores the writer options and honours only the session confs
  ``spark.databricks.delta.write.txnAppId`` / ``txnVersion``; they are set on the batch's own session for
  the one MERGE and removed after it. Several records of one key in a batch are reduced to the latest
  by ``order_by`` (ties broken by topic, partition, offset), so MERGE never sees two matches, and a
  matched row is only replaced by a newer record: the final state is the latest record of each key
  whatever the order of batches.

Unkeyed writes (at-least-once, at-most-once) carry no transaction id. Every commit carries the userMetadata.

Example (inside your own ``foreachBatch``)::

    >>> sink = DeltaSink(spec, spec.sink_specs[0])                                   # doctest: +SKIP
    >>> sink.write(valid_rows, Batch("orders", batch_id, end_offsets, keyed=True))   # doctest: +SKIP
    SinkWrite(rows_out=99900, replay_skipped=False)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from streamproof.config import DeltaSinkSpec
from streamproof.errors import PipelineError, SinkReplaced, first_line, retrying_delta_conflicts
from streamproof.sinks.base import Answer, Batch, FolderSink, HeldBatches, SinkCommit, SinkReading, SinkWrite
from streamproof.sinks.delta_log import (
    Restore,
    app_id,
    batches_back_to,
    commit_file,
    commits_on_disk,
    is_app_of,
    latest_version,
    log_past_its_commits,
    look_at_log,
    newest_commit,
    other_writers,
)
from streamproof.sinks.delta_table import as_nullable, create_empty_table, few_rows_file, table_schema
from streamproof.transform.records import recency, sink_rows_schema

# Other writers' commits (OPTIMIZE, another pipeline) read past, newest first, before Delta's own state is asked
# whether the pipeline wrote the table at all (:meth:`DeltaSink.last_commit`).
OTHERS_READ_PAST = 1_000
# A pipeline's first batch into a table of fewer versions reads their commit files (as many reads) for what the table
# holds of it, rather than asking Delta's own state (a rebuild of the table's state through Spark: 2.7 s of a first
# batch into a table made at the start, measured on a cold JVM).
YOUNG_LOG_VERSIONS = 10
CONFLICT_ATTEMPTS = 5  # a MERGE's tries when other writers commit what it read first
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def append_batch(
    frame: DataFrame,
    path: str,
    batch: Batch,
    *,
    merge_schema: bool = False,
    partition_by: Sequence[str] = (),
    app: str | None = None,
) -> None:
    """Append ``frame`` to the Delta table at ``path``, keyed on the batch when ``batch.keyed``; with
    ``merge_schema``, columns the table lacks are added to it (``schema_evolution = "add-columns"``);
    ``partition_by``: the table's partition columns (a new table is created with them); ``app``: the appId of a keyed
    batch (default: the pipeline's, :func:`streamproof.sinks.delta_log.app_id`). Delta's writer skips a keyed batch
    whose version is not above the appId's (its own check, a rebuild of the table state)."""
    writer = frame.write.format("delta").mode("append").option("userMetadata", batch.commit_metadata())
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if merge_schema:
        writer = writer.option("mergeSchema", "true")
    if batch.keyed:
        writer = writer.option("txnAppId", app or app_id(batch.pipeline)).option("txnVersion", batch.batch_id)
    writer.save(path)


def start_transaction(spark: SparkSession, path: str, *, latest: int | None = None) -> Any:
    """Delta's optimistic transaction on the table at ``path``; its snapshot's version is the table's latest (-1: no
    table yet). ``latest``: the latest version as the caller has just read it
    (:func:`streamproof.sinks.delta_log.latest_version`, a few existence checks). When Delta's cached snapshot is of
    that version, the transaction starts on it: Delta would otherwise list the table's log to update it, a listing
    whose cost grows with the table's age (measured: 0.8 s more a batch at 50,000 commits, `streamproof bench age`).
    A commit landing between that read and this transaction's commit is Delta's usual conflict: it is checked, as
    after any snapshot.

    >>> int(start_transaction(spark, "/data/orders").snapshot().version())               # doctest: +SKIP
    11
    """
    jvm = spark._jvm
    assert jvm is not None, "a classic Spark session has a JVM"
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    if latest is not None and latest >= 0:
        cached = log.unsafeVolatileSnapshot()
        if int(cached.version()) == latest:
            return log.startTransaction(jvm.scala.Option.empty(), jvm.scala.Some(cached))
    return log.startTransaction()


def commit_keyed(txn: Any, frame: DataFrame, batch: Batch, app: str | None = None) -> int:
    """Commit ``frame``'s files and SetTransaction ``(appId, batch id)`` in ``txn``, with the batch's userMetadata:
    the commit :func:`append_batch` makes, without Delta's lookup of the appId's version, which rebuilds the whole
    table state before every keyed write (measured: 3.0 s a commit against 0.57 s without it, 1,000 rows, 16
    appends). The caller decided the table does not hold the batch (:meth:`DeltaSink.append`) and that the frame
    fits the table (:func:`fits_table`). A concurrent commit of the same appId is still a conflict: the transaction
    records that it read the appId (``app``, default the pipeline's). Returns the version committed.

    >>> commit_keyed(start_transaction(spark, "/data/orders"), rows, Batch("orders", 8, ends, True))  # doctest: +SKIP
    12
    """
    jvm = frame.sparkSession._jvm
    assert jvm is not None, "a classic Spark session has a JVM"
    delta = jvm.org.apache.spark.sql.delta
    app = app or app_id(batch.pipeline)
    txn.readTxn().addOne(app)  # what txnVersion() records, minus the state rebuild
    actions = jvm.java.util.ArrayList()
    by_driver = few_rows_file(txn, frame)  # a batch's few gathered quarantined records: one file, no Spark job
    if by_driver is not None:
        actions.addAll(by_driver)
    else:
        written = txn.writeFiles(frame._jdf).iterator()
        while written.hasNext():
            actions.add(written.next())
    now = jvm.java.lang.Long.valueOf(str(int(time.time() * 1000)))
    actions.add(delta.actions.SetTransaction(app, batch.batch_id, jvm.scala.Some(now)))
    none = jvm.scala.Option.empty()
    write = getattr(delta, "DeltaOperations$Write")(
        jvm.org.apache.spark.sql.SaveMode.Append,
        none,
        none,
        jvm.scala.Some(batch.commit_metadata()),
        none,
        none,
        none,
        none,
        none,
    )
    return int(txn.commit(jvm.scala.jdk.javaapi.CollectionConverters.asScala(actions).toList(), write))


def fits_table(frame: DataFrame, txn: Any) -> bool:
    """Whether ``frame`` has the table's columns, in its order and of its types (nullability aside): only then may
    its files be committed through the transaction API, which skips the schema checks Delta's writer makes.

    >>> fits_table(rows, start_transaction(spark, "/data/orders"))                       # doctest: +SKIP
    True
    """
    return column_types(frame.schema) == column_types(table_schema(txn))


def column_types(schema: StructType) -> list[tuple[str, str]]:
    """``(name in lower case, type)`` of each column, in order, nullability aside.

    >>> from pyspark.sql.types import DoubleType, StringType, StructField
    >>> column_types(StructType([StructField("Order_Id", StringType()), StructField("amount", DoubleType())]))
    [('order_id', 'string'), ('amount', 'double')]
    """
    return [(field.name.lower(), field.dataType.simpleString()) for field in schema.fields]


def txn_version(txn: Any, pipeline: str) -> int:
    """Delta's own answer for the pipeline's appIds as of the transaction's snapshot: the highest batch any of them
    recorded, its own and those marked with a RESTORE (:func:`streamproof.sinks.delta_log.app_id`) alike (-1: none).
    A rebuild of the whole table state, asked only when the commit files cannot tell (an old table, a log cleaned up
    behind a Delta checkpoint)."""
    recorded, pairs = [-1], txn.snapshot().transactions().iterator()
    while pairs.hasNext():
        pair = pairs.next()
        if is_app_of(pair._1(), pipeline):
            recorded.append(int(pair._2()))
    return max(recorded)


def latest_per_key(rows: DataFrame, key: str, order_by: str) -> DataFrame:
    """One row per ``key``: the latest (:func:`streamproof.transform.records.recency`).

    Deterministic for a given set of rows, so a replayed batch reduces to the same rows.
    """
    newest_first = Window.partitionBy(key).orderBy(recency(order_by).desc())
    return rows.withColumn("_rank", F.row_number().over(newest_first)).where("_rank = 1").drop("_rank")


def partitions_of(rows: DataFrame, partition_by: Sequence[str], target: str = "t") -> Column:
    """A condition on the ``target`` table of a MERGE that keeps only the partitions ``rows`` fall in: Delta
    prunes the table's files with it before looking for matches (a null partition value is kept too).

    >>> partitions_of(latest, ["event_date"])                                          # doctest: +SKIP
    Column<'((t.event_date IN (2026-11-23, 2026-11-24)) OR false)'>
    """
    combinations = rows.select(*partition_by).distinct().collect()  # one job for every partition column
    condition = F.lit(True)
    for index, column in enumerate(partition_by):
        values = list(dict.fromkeys(combination[index] for combination in combinations))
        held = F.col(f"{target}.`{column}`")
        present = [value for value in values if value is not None]
        kept = held.isin(present) if present else F.lit(False)
        condition = condition & (kept | held.isNull() if None in values else kept)
    return condition


def newer_than(source: str, target: str, order_by: str) -> Column:
    """``source`` row is newer than ``target`` row (:func:`streamproof.transform.records.recency`)."""
    return recency(order_by, source) > recency(order_by, target)


class DeltaSink(FolderSink):
    """Valid records to a Delta table: append, or merge on ``key`` (see the module docstring)."""

    kind = "delta"
    spec: DeltaSinkSpec
    _log_read_through: int = -1  # the table version through which this run has read the log for its decisions
    _head_seen: int = -1  # the latest version :meth:`head` read: where the next look starts
    _head_file: tuple[int, int] | None = None  # the size and time of that version's commit file, as read then
    _restores: tuple[Restore, ...] = ()  # the RESTOREs met reading back to the pipeline's newest commit in effect

    def prepare(self, spark: SparkSession) -> None:
        """Set the table options of the pipeline file (creating the table with the pipeline's schema if new, with
        them) where the table lacks them. A start that finds them set commits nothing
        (tests/test_sink_idempotency.py)."""
        properties = {
            "delta.autoOptimize.optimizeWrite": self.spec.optimize_write,
            "delta.autoOptimize.autoCompact": self.spec.auto_compact,
        }
        wanted = {name: "true" for name, on in properties.items() if on}
        if not wanted:
            return
        transform = self.pipeline.transform
        schema = self.rows_schema or sink_rows_schema(spark, transform, derived=transform.aggregate is None)
        builder = DeltaTable.createIfNotExists(spark).location(str(self.path)).addColumns(schema)
        if self.spec.partition_by:
            builder = builder.partitionedBy(*self.spec.partition_by)
        for name, value in wanted.items():
            builder = builder.property(name, value)
        detail = builder.execute().detail().select("properties").first()
        held = dict(detail[0] or {}) if detail is not None else {}
        lacking = {name: value for name, value in wanted.items() if held.get(name) != value}
        if lacking:  # an ALTER commits a version even when it changes nothing: one a start, before
            assignments = ", ".join(f"'{name}' = '{value}'" for name, value in lacking.items())
            spark.sql(f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES ({assignments})")

    def refuse_unfit(self, spark: SparkSession) -> None:
        """A table partitioned otherwise than ``partition_by`` says."""
        if not self.spec.partition_by or not DeltaTable.isDeltaTable(spark, str(self.path)):
            return  # the first write creates it, partitioned
        detail = DeltaTable.forPath(spark, str(self.path)).detail().select("partitionColumns").first()
        held = list(detail[0]) if detail is not None else []
        if [c.lower() for c in held] != [c.lower() for c in self.spec.partition_by]:
            raise PipelineError(
                f"{self.path} is partitioned by {held or 'nothing'} but [sink] partition_by is "
                f"{self.spec.partition_by}: set partition_by to the table's, or write to a new path (Delta cannot "
                "change a table's partitioning in place)"
            )

    def write(self, rows: DataFrame, batch: Batch) -> SinkWrite:
        if self.spec.mode == "merge":
            # A MERGE reads the table: another writer's commit of files it read (an OPTIMIZE) fails it, and nothing is
            # committed. It runs again on the new snapshot (the replay rule asked again), as Delta's docs advise.
            return retrying_delta_conflicts(lambda: self._merge(rows, batch), CONFLICT_ATTEMPTS)
        return self.append(rows, batch, merge_schema=self.pipeline.transform.schema_evolution == "add-columns")

    def append(self, rows: DataFrame, batch: Batch, *, merge_schema: bool = False) -> SinkWrite:
        """Append a batch (the quarantine table's too). A keyed one is skipped when the table holds it (the replay
        rule, decided on the snapshot of the transaction that would commit it), else committed through Delta's
        transaction API (:func:`commit_keyed`); a new table, a schema-evolving write (``merge_schema``) or a batch
        whose columns are not the table's goes through Delta's writer and its checks (:func:`append_batch`).

        >>> sink.append(valid_rows, Batch("orders", 7, ends, keyed=True))                  # doctest: +SKIP
        SinkWrite(rows_out=16583, replay_skipped=False)
        """
        path = str(self.path)
        if not batch.keyed:
            append_batch(rows, path, batch, merge_schema=merge_schema, partition_by=self.spec.partition_by)
            return SinkWrite(batch.rows)
        txn = start_transaction(rows.sparkSession, path, latest=self.head())
        version = int(txn.snapshot().version())
        if self._holds(batch, txn, version):
            return SinkWrite(0, replay_skipped=True)
        try:
            if version >= 0 and not merge_schema and fits_table(rows, txn):
                committed = commit_keyed(txn, rows, batch, self._app_id())
                if committed == version + 1:  # nobody else committed in between: nothing more to read
                    self._log_read_through = committed
            else:
                self._append_through_delta_writer(rows, batch, merge_schema)
        except Exception:
            self.forget_held()  # it may have committed before failing: read again before the next attempt
            raise
        self.note_written(batch)
        return SinkWrite(batch.rows)

    def _append_through_delta_writer(self, rows: DataFrame, batch: Batch, merge_schema: bool) -> None:
        try:
            append_batch(
                rows,
                str(self.path),
                batch,
                merge_schema=merge_schema,
                partition_by=self.spec.partition_by,
                app=self._app_id(),
            )
        except AnalysisException as refused:  # a predictable mistake: one line, never a JVM trace
            if "DELTA" not in str(refused.getCondition() or ""):
                raise
            table = DeltaTable.forPath(rows.sparkSession, str(self.path)).toDF().schema.simpleString()
            raise PipelineError(
                f"{self.path} refused batch {batch.batch_id}: {first_line(refused)}; the table's columns are {table}, "
                f"the batch's {rows.schema.simpleString()}: make the pipeline's [transform] schema match the table, "
                'set schema_evolution = "add-columns" to add new columns, or write to a new table'
            ) from None

    def _holds(self, batch: Batch, txn: Any, version: int) -> bool:
        """The replay rule (:func:`streamproof.sinks.base.replay_decision`) on what the table holds as of ``version``,
        the snapshot of the transaction that would commit the batch: its newest commits back to the batch before
        ``batch``, read at the run's first keyed batch (:meth:`held_from`); later, only the commits made since the
        last read (another writer's, or this run's through Delta's writer)."""
        if self._held is None or version < self._log_read_through:
            self._held = HeldBatches(self._read_held(batch.batch_id - 1, version, txn))
        elif version > self._log_read_through:
            read_through = self._log_read_through
            found = batches_back_to(self.path, self.pipeline.name, version, -1, oldest=read_through + 1)
            if not found.complete or any(restore.to < read_through for restore in found.restores):
                # cleaned up, or restored to a version this run had read past: read back to the batch before again
                through = self._held.through
                self._held = HeldBatches(self._read_held(batch.batch_id - 1, version, txn))
                if found.restores and self._held.through < through:
                    holds = newest_commit(self.path, self.pipeline.name, version)
                    restore = found.restores[0]
                    raise PipelineError(
                        self._undone_while_running(restore, -1 if holds is None else holds.batch_id, through)
                    )
            for commit in found.commits.values():
                self._held.add(commit)
            self._log_read_through = version
        return self.replay_check(batch)

    def _app_id(self) -> str:
        """The appId of this run's keyed commits: the pipeline's, or, when a RESTORE was met reading back to its
        commits, one marked with that RESTORE (:func:`streamproof.sinks.delta_log.app_id`: Delta would skip the
        replay of an undone batch under the pipeline's own)."""
        return app_id(self.pipeline.name, after_restore=self._restores[0].version if self._restores else None)

    def _undone_while_running(self, restore: Restore, holds: int, through: int) -> str:
        return (
            f"{self.path} was restored while the pipeline ran: {restore} and with them batches {holds + 1}-"
            f"{through} the checkpoint has committed; the run stops here, and `streamproof checkpoint rewind "
            f"{self.pipeline._source_name}` replays them"
        )

    def held_from(self, first_batch: int) -> dict[int, SinkCommit]:
        """The newest commits only, back to ``first_batch`` (:func:`streamproof.sinks.delta_log.batches_back_to`)."""
        return self._read_held(first_batch, latest_version(self.path), None)

    def _read_held(self, first_batch: int, version: int, txn: Any) -> dict[int, SinkCommit]:
        self._log_read_through = version
        if version < 0:
            return {}  # no table yet
        young = version < YOUNG_LOG_VERSIONS  # its few commit files read below, rather than Delta's state rebuilt
        if first_batch < 0 and not young and txn_version(txn or self._transaction(), self.pipeline.name) < 0:
            return {}  # a pipeline's first batch into a table it never wrote: no reason to read the table's log
        found = batches_back_to(self.path, self.pipeline.name, version, first_batch)
        self._restores = tuple(found.restores)
        if not found.complete:
            self._refuse_unless_nothing_beyond(found.commits, first_batch, txn)
        return found.commits

    def _transaction(self) -> Any:
        spark = SparkSession.getActiveSession()
        if spark is None:
            raise PipelineError(f"{self.path}: the table's state is read through Spark, and no session runs here")
        return start_transaction(spark, str(self.path))

    def _refuse_unless_nothing_beyond(self, found: dict[int, SinkCommit], first_batch: int, txn: Any) -> None:
        """The commit files ran out (cleaned up behind a Delta checkpoint) before the commit of ``first_batch`` (the
        one before the batch to decide) or of an older one: with none of the pipeline's found, Delta's own state says
        whether the table holds any after it (its appId's version is the last batch written); holding some whose
        commits are gone, a replay of them cannot be checked."""
        through = txn_version(txn or self._transaction(), self.pipeline.name)
        if not found and through <= first_batch:  # the batch before the run's first may be held: its end is unchecked
            return
        raise PipelineError(
            f"{self.path} holds batches of pipeline {self.pipeline.name!r} up to {max([through, *found])}, and the "
            f"commit files of some from batch {first_batch + 1} on are cleaned up (Delta's log retention), so "
            "whether a replay of them matches cannot be checked: restore a checkpoint backup no older than the "
            "table's log retention, or rebuild the checkpoint from the sinks' records (move it aside, then "
            "`streamproof checkpoint recover PIPELINE`)"
        )

    def _merge(self, rows: DataFrame, batch: Batch) -> SinkWrite:
        spark = rows.sparkSession
        txn = start_transaction(spark, str(self.path), latest=self.head())  # on Delta's cached snapshot: no listing
        version = int(txn.snapshot().version())
        if batch.keyed and self._holds(batch, txn, version):
            return SinkWrite(0, replay_skipped=True)
        if version < 0:  # only then: on an existing table it is a command that lists the table's log twice
            created = DeltaTable.createIfNotExists(spark).location(str(self.path)).addColumns(rows.schema)
            (created.partitionedBy(*self.spec.partition_by) if self.spec.partition_by else created).execute()
        else:
            self._refuse_other_columns(rows, txn, batch)
        latest = latest_per_key(rows, str(self.spec.key), self.spec.order_by)
        matches = F.expr(f"t.`{self.spec.key}` = s.`{self.spec.key}`")
        if self.spec.partition_by:  # a key keeps its partition (config/sinks.py): look for it in the batch's only
            matches = matches & partitions_of(rows, self.spec.partition_by)
        confs = {USER_METADATA_CONF: batch.commit_metadata()}
        if batch.keyed:
            confs.update({TXN_APP_ID_CONF: self._app_id(), TXN_VERSION_CONF: str(batch.batch_id)})
        for name, value in confs.items():
            spark.conf.set(name, value)
        try:
            (
                DeltaTable.forPath(spark, str(self.path))
                .alias("t")
                .merge(latest.alias("s"), matches)
                .whenMatchedUpdateAll(condition=newer_than("s", "t", self.spec.order_by))
                .whenNotMatchedInsertAll()
                .execute()
            )
        except Exception:
            self.forget_held()
            raise
        finally:
            for name in confs:
                spark.conf.unset(name)
        self.note_written(batch)
        return SinkWrite(batch.rows)

    def _refuse_other_columns(self, rows: DataFrame, txn: Any, batch: Batch) -> None:
        """A MERGE's ``UPDATE *`` / ``INSERT *`` set the table's columns only: a batch column the table lacks would be
        dropped without a word, and one of another type cast. Refused unless the batch has the table's columns, of its
        types (nullability and order aside), read from the transaction's snapshot (no listing of the log)."""
        table = table_schema(txn)
        if set(column_types(rows.schema)) == set(column_types(table)):
            return
        raise PipelineError(
            f"{self.path} has the columns {table.simpleString()}, batch {batch.batch_id} has "
            f"{rows.schema.simpleString()}: a MERGE would drop the batch's columns the table lacks and cast those of "
            "another type; make the pipeline's [transform] schema match the table, or write to a new table"
        )

    def commits(self) -> list[SinkCommit]:
        return [
            SinkCommit(commit["batch_id"], commit["end_offsets"], commit["txn"])
            for commit in commits_on_disk(self.path, self.pipeline.name)
        ]

    head_meaning = "latest Delta version"

    def head(self) -> int:
        """The table's latest version (-1: no table): forward from the one read last, two existence checks when
        nothing else committed (:func:`streamproof.sinks.delta_log.latest_version`), whatever the table's age.
        :class:`SinkReplaced` when the commit file of the version read last is no longer the one read then (its size
        or time changed): the table was dropped and created again, or its log rewritten, under the running pipeline.
        The version numbers alone would not tell, and Delta's cached snapshot of the old table (which the next keyed
        commit starts on, :func:`start_transaction`) would commit onto the new one. One more file status a commit."""
        known, present = self._head_seen, False
        if known >= 0 and self._head_file is not None:
            now = commit_file(self.path, known).status()
            if now is not None and now != self._head_file:
                raise SinkReplaced(
                    f"{self.path} was replaced while the pipeline ran: its commit file of version {known} is not the "
                    "one this run read (another size or time: the table was dropped and created again, or its log "
                    "rewritten), so what it holds of the pipeline's batches is unknown to this run, which stops here; "
                    f"if they are gone from it, `streamproof checkpoint rewind {self.pipeline._source_name}` replays "
                    "them"
                )
            present = now is not None
        self._head_seen = latest_version(self.path, known=known, known_present=present)
        if self._head_seen >= 0 and (self._head_seen != known or self._head_file is None):
            self._head_file = commit_file(self.path, self._head_seen).status()
        return self._head_seen

    def last_commit(self, spark: SparkSession | None, *, latest: int | None = None) -> SinkCommit | None:
        """The pipeline's newest commit, read newest first (:func:`streamproof.sinks.delta_log.newest_commit`) from
        ``latest`` (the table's latest version, read now if not given). Past :data:`OTHERS_READ_PAST` commits of other
        writers, Delta's own state says whether the pipeline wrote the table at all (with a session), rather than every
        commit file of a table it may never have written."""
        latest = latest_version(self.path) if latest is None else latest
        oldest = max(latest - OTHERS_READ_PAST, 0)
        restores: list[Restore] = []
        found = newest_commit(self.path, self.pipeline.name, latest, oldest=oldest, restores=restores)
        self._restores = tuple(restores)
        if found is not None or oldest == 0:
            return found
        if spark is not None and txn_version(start_transaction(spark, str(self.path)), self.pipeline.name) < 0:
            return None
        resume = min([oldest - 1, *(restore.to for restore in restores)])  # where the first walk ended
        found = newest_commit(self.path, self.pipeline.name, resume, restores=restores)
        self._restores = tuple(restores)
        return found

    def read_at_start(self, spark: SparkSession | None, *, last_record: bool, holdings: bool) -> SinkReading:
        """As every sink's (a Delta table records what it holds), on one look at the log
        (:func:`streamproof.sinks.delta_log.look_at_log`) for both questions a start asks of it: the pipeline's newest
        commit, and, whatever the guarantee, files of versions past its last commit. A young table's log is listed once
        for both, where each listed it (and a dozen files more were looked for on S3)."""
        look = Answer.of(lambda: look_at_log(self.path))  # failed: both answers keep its error
        asked = last_record or holdings
        newest = Answer.of(lambda: self.last_commit(spark, latest=look.sure().latest)) if asked else None
        why = self.why_behind() if newest is not None and newest.error is None else None
        stranded = Answer.of(lambda: log_past_its_commits(self.path, look=look.sure()))
        recorded, holds = newest if last_record else None, newest if holdings else None
        lost = Answer.of(self.storage_lost) if holdings else None
        return SinkReading(self, True, recorded, lost, holds, why, stranded)

    def why_behind(self) -> str | None:
        """The RESTORE met reading back to the pipeline's newest commit that the table still holds, if one was
        (:meth:`last_commit`): its commit files stay in the log, so without it the table would look up to date."""
        if not self._restores:
            return None
        return str(self._restores[-1])  # the oldest met: the one that reached back past the pipeline's commits

    def other_writers(self) -> list[str]:
        return other_writers(self.path, self.pipeline.name) if (self.path / "_delta_log").exists() else []

    def read(self, spark: SparkSession) -> DataFrame | None:
        if not DeltaTable.isDeltaTable(spark, str(self.path)):
            return None
        return spark.read.format("delta").load(str(self.path))


class QuarantineTable(DeltaSink):
    """The quarantine table, read and written as the keyed Delta append it is (its commits carry the batch like a
    sink's); a message names it as itself, never as a sink.

    >>> QuarantineTable(spec, DeltaSinkSpec(kind="delta", path="/data/q")).called     # doctest: +SKIP
    'the quarantine table'
    """

    @property
    def called(self) -> str:
        return "the quarantine table"

    def create_table(self, spark: SparkSession, rows: StructType) -> None:
        """The table, when there is none, created empty as Delta's writer would create it on the first append of
        rows of schema ``rows`` (:func:`streamproof.sinks.delta_table.create_empty_table`)."""
        if self.head() < 0:
            create_empty_table(spark, str(self.path), as_nullable(rows))
