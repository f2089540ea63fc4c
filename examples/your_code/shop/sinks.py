"""Five ways to write a batch to PostgreSQL from your own sink, as data engineers write them in ``foreachBatch``;
``streamproof prove your_sinks.toml --matrix`` tells which guarantee each really gives (docs/your-code.md).

Each writes the batch's rows (event_id, order_id, amount and the ``_src_*`` lineage) to its own table, named by
the sink's ``options.table``; :func:`read_rows` reads any of them back for verification. Each marks the moments
between two of its commits with ``batch.step(...)``: where the proof's ``mid-sink-write`` crash lands.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession

COLUMNS = ("event_id", "order_id", "amount", "_src_topic", "_src_partition", "_src_offset")
SCHEMA = "event_id STRING, order_id STRING, amount DOUBLE, _src_topic STRING, _src_partition INT, _src_offset BIGINT"


def _connect(options: dict[str, Any]) -> psycopg.Connection[Any]:
    return psycopg.connect(host=options.get("host", "127.0.0.1"), port=int(options.get("port", 5432)),
                           dbname=options.get("database", "streamproof"), user=options.get("user", "streamproof"),
                           password=os.environ["STREAMPROOF_PG_PASSWORD"])  # fmt: skip


def _tables(connection: psycopg.Connection[Any], table: str) -> None:
    connection.execute(f"CREATE TABLE IF NOT EXISTS {table} (event_id text, order_id text, amount double precision, "
                       "_src_topic text, _src_partition int, _src_offset bigint)")  # fmt: skip
    connection.execute(f"CREATE TABLE IF NOT EXISTS {table}_ledger (pipeline text, batch_id bigint, part int, "
                       "PRIMARY KEY (pipeline, batch_id, part))")  # fmt: skip


def _written(connection: psycopg.Connection[Any], table: str, pipeline: str, batch_id: int, part: int = -1) -> bool:
    query = f"SELECT 1 FROM {table}_ledger WHERE pipeline = %s AND batch_id = %s AND part = %s"
    return connection.execute(query, (pipeline, batch_id, part)).fetchone() is not None


def _insert(connection: psycopg.Connection[Any], table: str, rows: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s)",
                           [tuple(row[c] for c in COLUMNS) for row in rows])  # fmt: skip


def _record(connection: psycopg.Connection[Any], table: str, pipeline: str, batch_id: int, part: int = -1) -> None:
    connection.execute(f"INSERT INTO {table}_ledger VALUES (%s, %s, %s)", (pipeline, batch_id, part))


def ledger_in_one_transaction(rows: DataFrame, batch: Any) -> None:
    """The ledger checked, the rows and the ledger row written, in one transaction: a replay finds its row and
    writes nothing, a crash before the commit leaves nothing. Exactly-once."""
    table, batch_rows = batch.options["table"], rows.select(*COLUMNS).collect()
    with _connect(batch.options) as connection:
        _tables(connection, table)
        connection.commit()
        if _written(connection, table, batch.pipeline, batch.id):
            return
        _insert(connection, table, batch_rows)
        batch.step("rows inserted, not committed")
        _record(connection, table, batch.pipeline, batch.id)
    # the with-block commits the rows and the ledger row together


def ledger_checked_before_written_after(rows: DataFrame, batch: Any) -> None:
    """The ledger checked, then the rows committed, then the ledger row committed: a crash between the two commits
    leaves rows without their ledger row, and the replay writes them again. Duplicates."""
    table, batch_rows = batch.options["table"], rows.select(*COLUMNS).collect()
    with _connect(batch.options) as connection:
        _tables(connection, table)
        connection.commit()
        if _written(connection, table, batch.pipeline, batch.id):
            return
        _insert(connection, table, batch_rows)
        connection.commit()
        batch.step("rows committed, ledger not written")
        _record(connection, table, batch.pipeline, batch.id)


def naive_write(rows: DataFrame, batch: Any) -> None:
    """The rows inserted, nothing checked: every replay writes the batch again. Duplicates."""
    table, batch_rows = batch.options["table"], rows.select(*COLUMNS).collect()
    with _connect(batch.options) as connection:
        _tables(connection, table)
        _insert(connection, table, batch_rows)
        connection.commit()
        batch.step("rows committed")


def per_partition_write(rows: DataFrame, batch: Any) -> None:
    """Each partition of the batch in its own transaction, keyed on (batch, Spark's partition id) as a
    ``ForeachWriter``'s ``open(partition_id, epoch_id)`` is, its ledger row in the same transaction. Exactly-once only
    if a replayed batch's partition ids hold the same records as its first attempt's: the matrix found they need not
    (docs/your-code.md), and then some rows are skipped and others written twice."""
    from pyspark import TaskContext

    table = batch.options["table"]
    with _connect(batch.options) as connection:
        _tables(connection, table)

    def write_partition(partition: Any) -> None:
        part = TaskContext.get().partitionId()
        with _connect(batch.options) as connection:
            if _written(connection, table, batch.pipeline, batch.id, part):
                return
            _insert(connection, table, list(partition))
            _record(connection, table, batch.pipeline, batch.id, part)
        if part == 0:
            batch.step(f"partition {part} committed")

    rows.select(*COLUMNS).foreachPartition(write_partition)


def per_source_partition_write(rows: DataFrame, batch: Any) -> None:
    """As :func:`per_partition_write`, keyed on the Kafka partition the rows came from (their ``_src_partition``)
    instead of Spark's partition id: the same records on every attempt, whatever order Spark plans them in."""
    from pyspark import TaskContext

    table = batch.options["table"]
    with _connect(batch.options) as connection:
        _tables(connection, table)

    def write_partition(partition: Any) -> None:
        held = list(partition)
        sources = {row["_src_partition"] for row in held}
        if not held:
            return
        assert len(sources) == 1, "a Kafka batch's Spark partition holds one Kafka partition (no minPartitions)"
        part = sources.pop()
        with _connect(batch.options) as connection:
            if _written(connection, table, batch.pipeline, batch.id, part):
                return
            _insert(connection, table, held)
            _record(connection, table, batch.pipeline, batch.id, part)
        if TaskContext.get().partitionId() == 0:
            batch.step(f"Kafka partition {part} committed")

    rows.select(*COLUMNS).foreachPartition(write_partition)


def read_rows(spark: SparkSession, options: dict[str, Any]) -> DataFrame | None:
    """What one of these sinks holds, with lineage: for ``streamproof verify``."""
    with _connect(options) as connection:
        exists = connection.execute("SELECT to_regclass(%s)", (options["table"],)).fetchone()
        if exists is None or exists[0] is None:
            return None
        held = connection.execute(f"SELECT {', '.join(COLUMNS)} FROM {options['table']}").fetchall()
    return spark.createDataFrame(held, SCHEMA)
