"""PostgreSQL sink: one database transaction per task of a batch, keyed on what it writes by a ledger row.

Idempotency, the mechanism (the rule, for batches and for shares, is :mod:`streamproof.sinks.base`'s; the write both
per-task sinks follow is :class:`streamproof.sinks.shares.ShareSink`'s): under exactly-once, each task's share of a
batch (one Kafka split: source partition and first offset, see :func:`streamproof.sinks.shares.peek_source_key`) is
written in one transaction that inserts the ledger row ``(pipeline, sink_table, batch_id, source_key)``, COPYs the
rows into a temporary table and moves them into the target, then records in the ledger row the batch's end offsets
and the source ranges it wrote; the transaction commits all of it or nothing. Once every task succeeded, a ``*``
ledger row marks the batch complete (a batch without it is partial: some shares are in).

* first write: the ledger insert succeeds and the rows follow it;
* replay (Spark re-runs a batch after a crash): a batch held whole (its ``*`` row) is skipped on the driver;
  in one held in part, the ledger insert finds the row (a concurrent zombie attempt waits on it, then finds
  it) and that share writes nothing, its rows being the ones the row records
  (:func:`~streamproof.sinks.base.share_decision`); the others write;
* inconsistency: a ledger row whose recorded source ranges differ from the replayed share's is a precise
  error (the checkpoint is not this table's, or the transform changed), never a silent skip; so is a replay
  of a batch held in part whose splits are not the shares written (``min_partitions`` changed:
  :func:`~streamproof.sinks.shares.split_refusal`, on the driver before any task writes).

Modes: ``append`` (``INSERT``), ``upsert`` (``INSERT .. ON CONFLICT (key) DO UPDATE`` only by a newer
record of the key: by ``order_by``, then topic, partition, offset), ``accumulate`` (per-``by`` running
totals, ``total = total + EXCLUDED.total``, which only the ledger keeps from counting a replay twice; a null
value adds 0, so a total is never NULL).
Without the ledger (at-least-once, at-most-once) the same statements run unkeyed.

Fencing (the run lock's lease, :class:`streamproof.checkpoint.folder.RunLock`): a run claims the table before its
first write (:meth:`PostgresSink.fence`): it ends the sessions of any earlier holder of the lease (named by
:func:`session_name`; a driver paused past its lease leaves them open, its transactions holding the ledger rows' locks
that would stall the new holder) and records its own lease in ``<ledger>_fence``. Every write transaction reads that
row first (``FOR SHARE``, so a claim waits for it or ends it) and writes nothing for another holder: a run that lost
its lease and wakes up is refused by the database itself. Proved by
``tests/test_lease.py::test_a_pipeline_paused_past_its_lease_is_taken_over_and_when_it_wakes_damages_nothing``
(``[inside-the-postgres-write]``).

Table and column names are validated identifiers (:mod:`streamproof.config`) and quoted; values only
travel through COPY and query parameters. The password is read from its environment variable when a
connection opens and is never logged.

Example::

    >>> sink = PostgresSink(spec, spec.sink_specs[0])                               # doctest: +SKIP
    >>> sink.prepare(spark); sink.write(valid_rows, Batch("orders", 4, offsets, keyed=True))   # doctest: +SKIP
    SinkWrite(rows_out=16583, replay_skipped=False)
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StructType, TimestampType

from streamproof.config import PipelineSpec, PostgresSinkSpec
from streamproof.errors import PipelineError
from streamproof.faults.in_tasks import TaskFault
from streamproof.sinks.base import Batch, ShareRecord, SinkCommit, share_decision
from streamproof.sinks.shares import (
    BATCH_COMPLETE,
    Shares,
    ShareSink,
    ShareWriter,
    SourceRanges,
    overlap_refusal,
    peek_source_key,
)
from streamproof.transform.records import COORDINATES, SOURCE_COLUMNS, struct_type

EXACT_NUMERIC = "numeric(38, 10)"
CLAIM_TRIES = 5  # how often a run ends an earlier holder's sessions and claims the table before it gives up
ENDED_WAIT_MS = 5_000  # how long it waits for each ended session to be gone (its transaction rolled back)


def session_name(pipeline: str, table: str, holder: str) -> str:
    """The ``application_name`` of a run's sessions writing ``table``: the pipeline and table by a digest, then the
    run's lease (PostgreSQL keeps 63 characters). A run ends the sessions of its table's prefix that are not its own.

    >>> session_name("orders", "orders_out", "0f" * 16)
    'streamproof:99f827674ca6a5c7:0f0f0f0f0f0f0f0f'
    """
    digest = hashlib.sha256(f"{pipeline}\0{table}".encode()).hexdigest()[:16]
    return f"streamproof:{digest}:{holder[:16]}"


def quoted(*names: str) -> str:
    """A (schema-qualified) identifier, quoted: ``quoted("public", "orders")`` -> ``"public"."orders"``."""
    return ".".join('"' + name.replace('"', '""') + '"' for name in names)


def postgres_type(data_type: DataType) -> str:
    """The PostgreSQL column type for a Spark type (nested types as jsonb)."""
    name = data_type.simpleString()
    simple = {
        "string": "text",
        "double": "double precision",
        "float": "real",
        "bigint": "bigint",
        "int": "integer",
        "smallint": "smallint",
        "tinyint": "smallint",
        "boolean": "boolean",
        "timestamp": "timestamptz",
        "timestamp_ntz": "timestamp",
        "date": "date",
        "binary": "bytea",
    }
    if name in simple:
        return simple[name]
    if name.startswith("decimal"):
        return name.replace("decimal", "numeric")
    return "jsonb"


@dataclass(frozen=True)
class PartitionWriter:
    """Everything a Python worker needs to write one partition (pickled to the executors)."""

    spec: PostgresSinkSpec
    pipeline: str
    columns: tuple[str, ...]  # of the rows it receives, in order
    target_columns: tuple[str, ...]  # stage -> target for append/upsert
    batch_id: int
    end_offsets: str  # JSON, key order as Spark logged it (kept as text: jsonb would reorder the keys)
    keyed: bool
    crash: TaskFault | None = None  # crash harness only
    # Resolved on the driver: executors on a cluster do not share its environment. Travels inside the
    # task like Spark's own JDBC writer's password; excluded from repr so that no log line prints it.
    password: str | None = field(default=None, repr=False)
    holder: str = ""  # the run lock's lease this write belongs to ("": no fencing, a sink used outside a run)

    @property
    def target(self) -> str:
        return quoted(self.spec.db_schema, self.spec.table)

    @property
    def ledger(self) -> str:
        return quoted(self.spec.db_schema, self.spec.ledger_table)

    @property
    def where(self) -> str:
        """The table, in a refusal's first words (no secret)."""
        return f"{self.spec.redacted()}/{self.spec.table}"

    def __call__(self, index: int, rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[int, int, bool]]:
        """Write partition ``index``; yield ``(index, rows written, skipped as a replay)``."""
        source_key, rows = peek_source_key(rows, self.columns)
        if source_key is None:
            yield index, 0, False  # no valid row in this split: nothing to write, nothing to record
            return
        name = session_name(self.pipeline, self.spec.table, self.holder) if self.holder else None
        with psycopg.connect(self.spec.conninfo(self.password), application_name=name) as connection:  # or rollback
            cursor = connection.cursor()
            if self.holder:
                refuse_if_fenced(cursor, self.spec, self.pipeline, self.holder)
            if self.keyed and not self._claim(cursor, source_key):  # its ledger row is there: held, or refused
                recorded = cursor.execute(
                    f"SELECT source_ranges FROM {self.ledger} WHERE pipeline = %s AND sink_table = %s "
                    "AND batch_id = %s AND source_key = %s",
                    (self.pipeline, self.spec.table, self.batch_id, source_key),
                ).fetchone()
                connection.rollback()
                ranges = SourceRanges(self.columns)
                for row in rows:
                    ranges.add(row)
                record = ShareRecord(self.batch_id, recorded[0] if recorded else None)
                yield index, 0, share_decision(record, self.batch_id, source_key, ranges.as_json(), self.where)
                return
            ranges = self._stage(cursor, rows)
            ranges.single_source()
            if self.keyed:
                self._refuse_overlap(cursor, source_key, ranges)
            if self.crash is not None:
                self.crash.reached(index)  # rows staged, nothing committed: the mid-sink-write point
            cursor.execute(self._move_statement())
            if self.keyed:
                cursor.execute(
                    f"UPDATE {self.ledger} SET source_ranges = %s, rows = %s WHERE pipeline = %s AND sink_table = %s "
                    "AND batch_id = %s AND source_key = %s",
                    (
                        json.dumps(ranges.as_json()),
                        ranges.count,
                        self.pipeline,
                        self.spec.table,
                        self.batch_id,
                        source_key,
                    ),
                )
        yield index, ranges.count, False

    def _claim(self, cursor: Any, source_key: str) -> bool:
        """Insert the ledger row; False when it exists already (this share of the batch was committed before)."""
        cursor.execute(
            f"INSERT INTO {self.ledger} (pipeline, sink_table, batch_id, source_key, end_offsets) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (self.pipeline, self.spec.table, self.batch_id, source_key, self.end_offsets),
        )
        return bool(cursor.rowcount == 1)

    def _refuse_overlap(self, cursor: Any, source_key: str, ranges: SourceRanges) -> None:
        """Refuse the share when another share of the batch, written before under another key, holds some of its rows
        (:func:`~streamproof.sinks.shares.overlap_refusal`); the transaction, its claim included, rolls back."""
        siblings = cursor.execute(
            f"SELECT source_key, source_ranges FROM {self.ledger} WHERE pipeline = %s AND sink_table = %s "
            "AND batch_id = %s AND starts_with(source_key, %s)",
            (self.pipeline, self.spec.table, self.batch_id, ranges.single_source() + "@"),
        ).fetchall()
        refusal = overlap_refusal(self.where, self.batch_id, source_key, ranges, siblings)
        if refusal is not None:
            raise PipelineError(refusal)

    def _stage(self, cursor: Any, rows: Iterable[tuple[Any, ...]]) -> SourceRanges:
        stage_columns = ", ".join(quoted(column) for column in self.columns)
        cursor.execute(
            f"CREATE TEMPORARY TABLE _streamproof_stage ON COMMIT DROP AS SELECT {self._stage_select()} LIMIT 0"
        )
        ranges = SourceRanges(self.columns)
        with cursor.copy(f"COPY _streamproof_stage ({stage_columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
                ranges.add(row)
        return ranges

    def _stage_select(self) -> str:
        # The stage has the rows' columns with the target's types (coordinates typed as the ledger needs).
        if self.spec.mode == "accumulate":
            sums = [f"NULL::{EXACT_NUMERIC} AS {quoted(column)}" for column in self.spec.sum]
            coordinates = ["NULL::text AS _src_topic", "NULL::integer AS _src_partition", "NULL::bigint AS _src_offset"]
            return ", ".join([f"NULL::text AS {quoted(str(self.spec.by))}", *sums, *coordinates])
        return f"{', '.join(quoted(c) for c in self.columns)} FROM {self.target}"

    def _move_statement(self) -> str:
        spec, target = self.spec, self.target
        if spec.mode == "accumulate":
            by, sums = quoted(str(spec.by)), [quoted(column) for column in spec.sum]
            # A null value adds 0 (as the checkers expect): sum() of a batch whose values are all null is NULL, and
            # NULL + x stays NULL, so a NULL batch total would poison the running total for good. A NULL an older
            # version left in the table counts as 0 too.
            totals = ", ".join(f"coalesce(sum({column}), 0)" for column in sums)
            updates = ", ".join(
                [
                    *(f"{c} = coalesce(t.{c}, 0) + EXCLUDED.{c}" for c in sums),
                    '"events" = t."events" + EXCLUDED."events"',
                ]
            )
            return (
                f"INSERT INTO {target} AS t ({by}, {', '.join(sums)}, events) "
                f"SELECT {by}, {totals}, count(*) FROM _streamproof_stage GROUP BY {by} ORDER BY {by} "
                f"ON CONFLICT ({by}) DO UPDATE SET {updates}"
            )
        columns = ", ".join(quoted(column) for column in self.target_columns)
        if spec.mode == "append":
            return f"INSERT INTO {target} ({columns}) SELECT {columns} FROM _streamproof_stage"
        key, order = quoted(str(spec.key)), quoted(spec.order_by)
        coordinates = [quoted(column) for column in COORDINATES]
        newest_first = ", ".join([f"{order} DESC NULLS LAST", *(f"{c} DESC" for c in coordinates)])
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in (quoted(c) for c in self.target_columns) if c != key)
        # Only a newer record replaces a key's row; the lock order (by key) keeps concurrent partitions
        # from deadlocking on shared keys.
        return (
            f"INSERT INTO {target} AS t ({columns}) SELECT {columns} FROM (SELECT DISTINCT ON ({key}) * "
            f"FROM _streamproof_stage ORDER BY {key}, {newest_first}) AS latest ORDER BY {key} "
            f"ON CONFLICT ({key}) DO UPDATE SET {updates} WHERE {newer_than('EXCLUDED', 't', order)}"
        )


def fence_table(spec: PostgresSinkSpec) -> str:
    """The table that names, per pipeline and target table, the lease of the run allowed to write it."""
    return quoted(spec.db_schema, spec.ledger_table + "_fence")


def refuse_if_fenced(cursor: Any, spec: PostgresSinkSpec, pipeline: str, holder: str) -> None:
    """First statement of a write transaction: raise :class:`PipelineError` unless the table's fence row names the
    lease ``holder``. ``FOR SHARE``: a newer run's claim waits for this transaction, or ends its session."""
    row = cursor.execute(
        f"SELECT holder FROM {fence_table(spec)} WHERE pipeline = %s AND sink_table = %s FOR SHARE",
        (pipeline, spec.table),
    ).fetchone()
    if row is None or row[0] != holder:
        claimed = f"by another run (lease {row[0][:8]})" if row is not None else "by no run"
        raise PipelineError(
            f"{spec.redacted()}/{spec.table} is claimed {claimed}, not this one (lease {holder[:8]}): this run lost "
            "its lease and writes nothing more"
        )


def newer_than(source: str, target: str, order: str) -> str:
    """SQL: the ``source`` row is newer than ``target``, by :func:`streamproof.transform.records.recency`'s rule: by
    ``order`` (null oldest), then coordinates (topic compared bytewise, as Spark does). SQL's row comparison
    yields null where a value is null, hence the cases."""
    same_order = f"{source}.{order} IS NOT DISTINCT FROM {target}.{order}"
    by_coordinates = (
        f'({source}._src_topic COLLATE "C", {source}._src_partition, {source}._src_offset) > '
        f'({target}._src_topic COLLATE "C", {target}._src_partition, {target}._src_offset)'
    )
    return (
        f"CASE WHEN {same_order} THEN {by_coordinates} WHEN {source}.{order} IS NULL THEN false "
        f"WHEN {target}.{order} IS NULL THEN true ELSE {source}.{order} > {target}.{order} END"
    )


class PostgresSink(ShareSink):
    """Valid records to a PostgreSQL table, written share by share (:meth:`ShareSink.write`), each share keyed by its
    ledger row (see the module docstring); unkeyed, the same statements without the ledger."""

    kind = "postgres"
    partial_writes_visible = True  # unkeyed, each partition commits on its own
    writes_in_python_tasks = True
    spec: PostgresSinkSpec

    def __init__(self, pipeline: PipelineSpec, spec: PostgresSinkSpec) -> None:
        super().__init__(pipeline, spec)
        self.target = quoted(spec.db_schema, spec.table)
        self.ledger = quoted(spec.db_schema, spec.ledger_table)
        self.holder = ""  # the lease this run writes under, once it claimed the table (fence)

    @property
    def location(self) -> str:
        return f"{self.spec.redacted()}/{self.spec.db_schema}.{self.spec.table}"

    def _connect(self, autocommit: bool = False, *, named: bool = False) -> Any:
        """A session (``named``: as this run's writes, so that a newer holder's :meth:`fence` ends it)."""
        name = session_name(self.pipeline.name, self.spec.table, self.holder) if named and self.holder else None
        try:
            return psycopg.connect(self.spec.conninfo(), autocommit=autocommit, application_name=name)
        except psycopg.OperationalError as error:
            first = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            raise PipelineError(
                f"cannot connect to {self.spec.redacted()}: {first}; start it with `streamproof infra up --postgres` "
                "or fix the sink's host, port, user and password variable"
            ) from None

    def refuse_unfit(self, spark: SparkSession) -> None:
        """An existing target table without some of the pipeline's columns (before anything is created)."""
        with self._connect(autocommit=True) as connection:
            existing = {
                row[0]
                for row in connection.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
                    (self.spec.db_schema, self.spec.table),
                )
            }
        missing = [name for name in self._columns() if name not in existing]
        if existing and missing:  # none: the table is not there yet, and prepare creates it whole
            raise PipelineError(
                f"{self.location} exists without column(s) {', '.join(missing)}: add them, or write to a new table"
            )

    def _columns(self) -> dict[str, str]:
        fields = [
            field
            for field in (self.rows_schema or struct_type(self.pipeline.transform.schema_)).fields
            if field.name not in SOURCE_COLUMNS
        ]  # the coordinates' columns are added by _table_columns
        return self._table_columns({field.name: postgres_type(field.dataType) for field in fields})

    def prepare(self, spark: SparkSession) -> None:
        """Create the schema, target table and ledger if missing (an existing table's columns: :meth:`refuse_unfit`)."""
        columns = self._columns()
        definition = ", ".join(f"{quoted(name)} {kind}" for name, kind in columns.items())
        primary = {"upsert": self.spec.key, "accumulate": self.spec.by}.get(self.spec.mode)
        if primary:
            definition += f", PRIMARY KEY ({quoted(primary)})"
        with self._connect(autocommit=True) as connection:
            connection.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted(self.spec.db_schema)}")
            connection.execute(f"CREATE TABLE IF NOT EXISTS {self.target} ({definition})")
            connection.execute(
                f"CREATE TABLE IF NOT EXISTS {self.ledger} (pipeline text NOT NULL, sink_table text NOT NULL, "
                "batch_id bigint NOT NULL, source_key text NOT NULL, "
                "end_offsets text NOT NULL, source_ranges jsonb, rows bigint, committed_at timestamptz NOT NULL "
                "DEFAULT now(), PRIMARY KEY (pipeline, sink_table, batch_id, source_key))"
            )
            connection.execute(
                f"CREATE TABLE IF NOT EXISTS {fence_table(self.spec)} (pipeline text NOT NULL, sink_table text NOT "
                "NULL, holder text NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now(), "
                "PRIMARY KEY (pipeline, sink_table))"
            )

    def fence(self, holder: str) -> None:
        """Claim the table for the run holding the lease ``holder``: end the sessions an earlier holder left open
        (their transactions roll back, their row locks go), then name ``holder`` in the fence row, which every write
        transaction reads first (:func:`refuse_if_fenced`). Tried again while a session of the earlier holder opened
        in between keeps the row locked.

        >>> sink.prepare(spark); sink.fence(lock.holder_id)                                  # doctest: +SKIP
        """
        self.holder = holder
        if not holder:
            return
        mine = session_name(self.pipeline.name, self.spec.table, holder)
        prefix = mine.rsplit(":", 1)[0] + ":"
        with self._connect(autocommit=True) as connection:
            for _ in range(CLAIM_TRIES):
                try:
                    ended = connection.execute(
                        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, %s)) FROM pg_stat_activity "
                        "WHERE starts_with(application_name, %s) AND application_name <> %s",
                        (ENDED_WAIT_MS, prefix, mine),
                    ).fetchone()[0]
                    with connection.transaction():
                        connection.execute("SET LOCAL lock_timeout = '2s'")
                        connection.execute(
                            f"INSERT INTO {fence_table(self.spec)} (pipeline, sink_table, holder) VALUES (%s, %s, %s) "
                            "ON CONFLICT (pipeline, sink_table) DO UPDATE SET holder = EXCLUDED.holder, "
                            "claimed_at = now()",
                            (self.pipeline.name, self.spec.table, holder),
                        )
                except psycopg.errors.LockNotAvailable:
                    continue  # a session of the earlier holder opened after the sweep: end it too
                except psycopg.errors.InsufficientPrivilege:
                    raise PipelineError(
                        f"{self.location}: user {self.spec.user!r} may not end the sessions an earlier run left "
                        f"open; grant it pg_signal_backend, or run the pipeline as their user"
                    ) from None
                if ended:
                    print(f"[streamproof] {self.location}: ended {ended} session(s) of an earlier holder of the run "
                          "lock; their open transactions rolled back", file=sys.stderr, flush=True)  # fmt: skip
                return
        raise PipelineError(
            f"{self.location}: sessions of an earlier run kept the table's fence row locked through {CLAIM_TRIES} "
            "claims; stop that run (application_name streamproof:...) and start again"
        )

    def _table_columns(self, schema_types: dict[str, str]) -> dict[str, str]:
        if self.spec.mode == "accumulate":
            return {str(self.spec.by): "text", **{c: EXACT_NUMERIC for c in self.spec.sum}, "events": "bigint"}
        coordinates = {
            "_src_topic": "text",
            "_src_partition": "integer",
            "_src_offset": "bigint",
            "_src_timestamp": "timestamptz",
        }
        return {**schema_types, **coordinates}

    @property
    def shares_where(self) -> str:
        return f"{self.spec.redacted()}/{self.spec.table}"

    def _share_rows(self, rows: DataFrame) -> DataFrame:
        return _as_copy_text(self._rows_for_mode(rows))

    def _recorded_shares(self, batch: Batch) -> Shares:
        """The ledger rows of ``batch``: their source keys and source ranges."""
        with self._connect() as connection:
            recorded: Shares = connection.execute(
                f"SELECT source_key, source_ranges FROM {self.ledger} WHERE pipeline = %s AND sink_table = %s "
                "AND batch_id = %s",
                (batch.pipeline, self.spec.table, batch.batch_id),
            ).fetchall()
        return recorded

    def _share_writer(self, batch: Batch, columns: tuple[str, ...], tasks: int, fault: TaskFault | None) -> ShareWriter:
        return PartitionWriter(
            self.spec,
            batch.pipeline,
            columns,
            tuple(c for c in columns if self.spec.mode != "accumulate"),
            batch.batch_id,
            json.dumps(batch.end_offsets),
            batch.keyed,
            fault,
            self.spec.password(),
            self.holder,
        )

    def _record_batch_complete(self, batch: Batch) -> None:
        """Every share of the batch committed: say so in the ledger (a batch without this row is partial)."""
        with self._connect(named=True) as connection:
            if self.holder:
                refuse_if_fenced(connection.cursor(), self.spec, batch.pipeline, self.holder)
            connection.execute(
                f"INSERT INTO {self.ledger} (pipeline, sink_table, batch_id, source_key, end_offsets) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (batch.pipeline, self.spec.table, batch.batch_id, BATCH_COMPLETE, json.dumps(batch.end_offsets)),
            )

    def _rows_for_mode(self, rows: DataFrame) -> DataFrame:
        if self.spec.mode == "accumulate":
            return rows.select(str(self.spec.by), *self.spec.sum, *COORDINATES)
        return rows.select(*(c for c in rows.columns if c not in SOURCE_COLUMNS), *SOURCE_COLUMNS)

    head_meaning = "latest batch in its ledger"

    def head(self) -> int:
        """The ledger's latest batch of this sink (-1: none, or no ledger: exactly-once keeps one)."""
        try:
            with self._connect() as connection:
                row = connection.execute(
                    f"SELECT coalesce(max(batch_id), -1) FROM {self.ledger} WHERE pipeline = %s AND sink_table = %s",
                    (self.pipeline.name, self.spec.table),
                ).fetchone()
        except psycopg.errors.UndefinedTable:
            return -1
        return int(row[0])

    def commits(self) -> list[SinkCommit]:
        try:
            with self._connect() as connection:
                rows = connection.execute(
                    f"SELECT batch_id, max(end_offsets), bool_or(source_key = %s) FROM {self.ledger} "
                    "WHERE pipeline = %s AND sink_table = %s GROUP BY batch_id ORDER BY batch_id",
                    (BATCH_COMPLETE, self.pipeline.name, self.spec.table),
                ).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
        return [
            SinkCommit(int(batch), json.loads(offsets), keyed=True, complete=bool(done))
            for batch, offsets, done in rows
        ]

    def read(self, spark: SparkSession) -> DataFrame | None:
        """The table through Spark's JDBC reader (PostgreSQL's driver is in the cached jars)."""
        if not self._table_exists():
            return None
        password = self.spec.password() or ""
        return (
            spark.read.format("jdbc")
            .option("url", f"jdbc:postgresql://{self.spec.host}:{self.spec.port}/{self.spec.database}")
            .option("dbtable", self.target)
            .option("user", self.spec.user)
            .option("password", password)
            .option("driver", "org.postgresql.Driver")
            .load()
        )

    def _table_exists(self) -> bool:
        with self._connect() as connection:
            found = connection.execute("SELECT to_regclass(%s)", (f"{self.spec.db_schema}.{self.spec.table}",))
            return found.fetchone()[0] is not None


def _as_copy_text(rows: DataFrame) -> DataFrame:
    """Every column as the text PostgreSQL's COPY reads: timestamps with their UTC offset, nested values as
    JSON, bytes as ``\\x`` hex; nulls stay null."""
    columns = []
    for column_field in rows.schema.fields:
        column, data_type = F.col(column_field.name), column_field.dataType
        if isinstance(data_type, TimestampType):
            column = F.date_format(column, "yyyy-MM-dd HH:mm:ss.SSSSSSXXX")
        elif isinstance(data_type, ArrayType | MapType | StructType):
            column = F.to_json(column)
        elif isinstance(data_type, BinaryType):
            column = F.concat(F.lit("\\x"), F.lower(F.hex(column)))
        columns.append(column.cast("string").alias(column_field.name))
    return rows.select(*columns)
