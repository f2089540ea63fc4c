"""Five ways to write a batch to PostgreSQL from a ``foreachBatch`` function, as data engineers write them;
``streamproof prove your_sinks.toml --matrix`` tells which guarantee each really gives (docs/your-code.md).

Each is Spark's ``f(batch_df, batch_id)`` and writes the batch's rows (event_id, order_id, amount and the ``_src_*``
lineage) to its own ``table`` (a keyword argument: the sink's options); :func:`read_rows` reads any of them back for
verification. Nothing marks their commits: streamproof finds each one while the write runs, and crashes there.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from pyspark.sql import DataFrame, SparkSession

COLUMNS = ("event_id", "order_id", "amount", "_src_topic", "_src_partition", "_src_offset")
SCHEMA = "event_id STRING, order_id STRING, amount DOUBLE, _src_topic STRING, _src_partition INT, _src_offset BIGINT"


def _connect(port: int) -> psycopg.Connection[Any]:
    return psycopg.connect(host="127.0.0.1", port=port, dbname="streamproof", user="streamproof",
                           password=os.environ["STREAMPROOF_PG_PASSWORD"])  # fmt: skip


def _tables(connection: psycopg.Connection[Any], table: str) -> None:
    connection.execute(f"CREATE TABLE IF NOT EXISTS {table} (event_id text, order_id text, amount double precision, "
                       "_src_topic text, _src_partition int, _src_offset bigint)")  # fmt: skip
    connection.execute(f"CREATE TABLE IF NOT EXISTS {table}_ledger (batch_id bigint, part int, "
                       "PRIMARY KEY (batch_id, part))")  # fmt: skip


def _written(connection: psycopg.Connection[Any], table: str, batch_id: int, part: int = -1) -> bool:
    query = f"SELECT 1 FROM {table}_ledger WHERE batch_id = %s AND part = %s"
    return connection.execute(query, (batch_id, part)).fetchone() is not None


def _insert(connection: psycopg.Connection[Any], table: str, rows: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s)",
                           [tuple(row[c] for c in COLUMNS) for row in rows])  # fmt: skip


def _record(connection: psycopg.Connection[Any], table: str, batch_id: int, part: int = -1) -> None:
    connection.execute(f"INSERT INTO {table}_ledger VALUES (%s, %s)", (batch_id, part))


def ledger_in_one_transaction(rows: DataFrame, batch_id: int, table: str, port: int = 5432) -> None:
    """The ledger checked, the rows and the ledger row written, in one transaction: a replay finds its row and
    writes nothing, a crash before the commit leaves nothing. Exactly-once."""
    batch_rows = rows.select(*COLUMNS).collect()
    with _connect(port) as connection:
        _tables(connection, table)
        connection.commit()
        if _written(connection, table, batch_id):
            return
        _insert(connection, table, batch_rows)
        _record(connection, table, batch_id)
    # the with-block commits the rows and the ledger row together


def ledger_checked_before_written_after(rows: DataFrame, batch_id: int, table: str, port: int = 5432) -> None:
    """The ledger checked, then the rows committed, then the ledger row committed: a crash between the two commits
    leaves rows without their ledger row, and the replay writes them again. Duplicates."""
    batch_rows = rows.select(*COLUMNS).collect()
    with _connect(port) as connection:
        _tables(connection, table)
        connection.commit()
        if _written(connection, table, batch_id):
            return
        _insert(connection, table, batch_rows)
        connection.commit()
        _record(connection, table, batch_id)


def naive_write(rows: DataFrame, batch_id: int, table: str, port: int = 5432) -> None:
    """The rows inserted, nothing checked: every replay writes the batch again. Duplicates."""
    batch_rows = rows.select(*COLUMNS).collect()
    with _connect(port) as connection:
        _tables(connection, table)
        _insert(connection, table, batch_rows)


def per_partition_write(rows: DataFrame, batch_id: int, table: str, port: int = 5432) -> None:
    """Each partition of the batch in its own transaction, keyed on (batch, Spark's partition id) as a
    ``ForeachWriter``'s ``open(partition_id, epoch_id)`` is, its ledger row in the same transaction. Exactly-once only
    if a replayed batch's partition ids hold the same records as its first attempt's: the matrix found they need not
    (docs/your-code.md), and then some rows are skipped and others written twice."""
    from pyspark import TaskContext

    with _connect(port) as connection:
        _tables(connection, table)

    def write_partition(partition: Any) -> None:
        part = TaskContext.get().partitionId()
        with _connect(port) as connection:
            if _written(connection, table, batch_id, part):
                return
            _insert(connection, table, list(partition))
            _record(connection, table, batch_id, part)

    rows.select(*COLUMNS).foreachPartition(write_partition)


def per_source_partition_write(rows: DataFrame, batch_id: int, table: str, port: int = 5432) -> None:
    """As :func:`per_partition_write`, keyed on the Kafka partition the rows came from (their ``_src_partition``)
    instead of Spark's partition id: the same records on every attempt, whatever order Spark plans them in."""
    with _connect(port) as connection:
        _tables(connection, table)

    def write_partition(partition: Any) -> None:
        held = list(partition)
        sources = {row["_src_partition"] for row in held}
        if not held:
            return
        assert len(sources) == 1, "a Kafka batch's Spark partition holds one Kafka partition (no minPartitions)"
        part = sources.pop()
        with _connect(port) as connection:
            if _written(connection, table, batch_id, part):
                return
            _insert(connection, table, held)
            _record(connection, table, batch_id, part)

    rows.select(*COLUMNS).foreachPartition(write_partition)


def read_rows(spark: SparkSession, options: dict[str, Any]) -> DataFrame | None:
    """What one of these sinks holds, with lineage: for ``streamproof verify``."""
    with _connect(int(options.get("port", 5432))) as connection:
        exists = connection.execute("SELECT to_regclass(%s)", (options["table"],)).fetchone()
        if exists is None or exists[0] is None:
            return None
        held = connection.execute(f"SELECT {', '.join(COLUMNS)} FROM {options['table']}").fetchall()
    return spark.createDataFrame(held, SCHEMA)
