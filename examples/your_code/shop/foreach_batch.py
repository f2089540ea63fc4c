"""Four ways to write a micro-batch, as data engineers write them for Spark's ``foreachBatch`` (and ``foreach``),
with nothing of streamproof in them: ``foreach_batch.toml`` hands each to streamproof as it is, and
``streamproof prove foreach_batch.toml --matrix`` finds, with no marker here, the moments each goes through and the
guarantee each really gives (docs/your-code.md).

1. :func:`idempotent_write`: a Delta "processed batches" control table, checked first, appended after the data;
2. :func:`upsert_to_delta`: a MERGE on the business key, each order's latest event;
3. :func:`jdbc_upsert`: the batch collected to the driver and upserted into PostgreSQL in one transaction;
4. :class:`EpochLedgerWriter`: a ``ForeachWriter`` whose ``open(partition_id, epoch_id)`` skips a partition its
   ledger holds, and whose ``close`` commits the rows with their ledger row.

Each also has a ``read_*`` function returning what it holds, for verification. PostgreSQL is reached with the
``conninfo`` given (libpq reads the password from ``PGPASSWORD``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

ORDERS = "s3://shop-lake/orders"  # where the tutorials put them; the pipeline file gives local paths
PROCESSED_BATCHES = "s3://shop-lake/_control/processed_batches"
LATEST_ORDERS = "s3://shop-lake/orders_latest"
CONNINFO = "host=127.0.0.1 port=5432 dbname=streamproof user=streamproof"
COLUMNS = ["event_id", "order_id", "amount", "status", "event_time", "_src_topic", "_src_partition", "_src_offset"]
ROW_TYPES = ("event_id text, order_id text, amount double precision, status text, event_time timestamp, "
             "_src_topic text, _src_partition int, _src_offset bigint")  # fmt: skip
SCHEMA = ("event_id STRING, order_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP, _src_topic STRING, "
          "_src_partition INT, _src_offset BIGINT")  # fmt: skip


# 1. The control-table ledger ---------------------------------------------------------------------------------------


def idempotent_write(batch_df: DataFrame, batch_id: int, data_path: str = ORDERS,
                     control_path: str = PROCESSED_BATCHES) -> None:  # fmt: skip
    """Write each batch exactly once: skip it when the control table says it was processed, else append it and
    record it (the data and the control table are both Delta, so the two writes are atomic)."""
    spark = batch_df.sparkSession
    try:
        processed = spark.read.format("delta").load(control_path)
        if processed.filter(processed.batch_id == batch_id).count() > 0:
            print(f"batch {batch_id} already processed, skipping")
            return
    except Exception:  # noqa: BLE001 - the control table does not exist yet: nothing was processed
        pass
    batch_df.select(*COLUMNS).write.format("delta").mode("append").save(data_path)
    marker = spark.createDataFrame([(batch_id, datetime.now())], "batch_id LONG, processed_at TIMESTAMP")
    marker.write.format("delta").mode("append").save(control_path)


def read_ledgered(spark: SparkSession, options: dict[str, Any]) -> DataFrame | None:
    """What :func:`idempotent_write` holds."""
    path = options.get("data_path", ORDERS)
    return spark.read.format("delta").load(path) if DeltaTable.isDeltaTable(spark, path) else None


# 2. The MERGE upsert ------------------------------------------------------------------------------------------------


def upsert_to_delta(batch_df: DataFrame, batch_id: int, path: str = LATEST_ORDERS) -> None:
    """Each order's latest event, merged on ``order_id``: a replayed batch merges the same rows again."""
    spark = batch_df.sparkSession
    newest_first = Window.partitionBy("order_id").orderBy(F.col("event_time").desc(), F.col("_src_offset").desc())
    latest = (
        batch_df.select(*COLUMNS)
        .withColumn("rank", F.row_number().over(newest_first))
        .filter("rank = 1")
        .drop("rank")
    )
    if not DeltaTable.isDeltaTable(spark, path):
        latest.limit(0).write.format("delta").save(path)
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(latest.alias("s"), "t.order_id = s.order_id")
        .whenMatchedUpdateAll(condition="s.event_time >= t.event_time")
        .whenNotMatchedInsertAll()
        .execute()
    )
    print(f"batch {batch_id}: merged {latest.count()} orders")


def read_latest(spark: SparkSession, options: dict[str, Any]) -> DataFrame | None:
    """What :func:`upsert_to_delta` holds."""
    path = options.get("path", LATEST_ORDERS)
    return spark.read.format("delta").load(path) if DeltaTable.isDeltaTable(spark, path) else None


# 3. The JDBC upsert from the driver ----------------------------------------------------------------------------------


def jdbc_upsert(batch_df: DataFrame, batch_id: int, table: str = "orders_latest", conninfo: str = CONNINFO) -> None:
    """Collect the batch, upsert every row on ``order_id`` (a newer event wins) and commit once."""
    rows = [tuple(row) for row in batch_df.select(*COLUMNS).collect()]
    with psycopg.connect(conninfo) as connection:
        connection.execute(f"CREATE TABLE IF NOT EXISTS {table} ({ROW_TYPES}, PRIMARY KEY (order_id))")
        with connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (order_id) DO UPDATE SET "
                + ", ".join(f"{column} = excluded.{column}" for column in COLUMNS if column != "order_id")
                + f" WHERE excluded.event_time >= {table}.event_time",
                rows,
            )
    print(f"batch {batch_id}: upserted {len(rows)} rows")


# 4. The ForeachWriter with an epoch ledger ---------------------------------------------------------------------------


class EpochLedgerWriter:
    """Spark's ``foreach`` writer: each partition of each epoch (batch) once, recorded in a ledger table committed with
    its rows."""

    def __init__(self, table: str = "orders_by_epoch", conninfo: str = CONNINFO) -> None:
        self.table, self.conninfo = table, conninfo
        self.connection: psycopg.Connection[Any] | None = None

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.partition_id, self.epoch_id, self.rows = partition_id, epoch_id, []
        self.connection = psycopg.connect(self.conninfo)
        try:  # every partition's writer creates the tables: two at once may race on PostgreSQL's catalog
            self.connection.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ({ROW_TYPES})")
            self.connection.execute(f"CREATE TABLE IF NOT EXISTS {self.table}_epochs (partition_id int, "
                                    "epoch_id bigint, PRIMARY KEY (partition_id, epoch_id))")  # fmt: skip
            self.connection.commit()
        except psycopg.errors.UniqueViolation:
            self.connection.rollback()  # the other writer created them
        done = self.connection.execute(f"SELECT 1 FROM {self.table}_epochs WHERE partition_id = %s AND epoch_id = %s",
                                       (partition_id, epoch_id)).fetchone()  # fmt: skip
        return done is None

    def process(self, row: Any) -> None:
        self.rows.append(tuple(row[column] for column in COLUMNS))

    def close(self, error: BaseException | None) -> None:
        if self.connection is None:
            return
        if error is None and self.rows:
            with self.connection.cursor() as cursor:
                cursor.executemany(f"INSERT INTO {self.table} VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", self.rows)
            self.connection.execute(f"INSERT INTO {self.table}_epochs VALUES (%s, %s) ON CONFLICT DO NOTHING",
                                    (self.partition_id, self.epoch_id))  # fmt: skip
            self.connection.commit()
        self.connection.close()


def read_postgres(spark: SparkSession, options: dict[str, Any]) -> DataFrame | None:
    """What :func:`jdbc_upsert` or :class:`EpochLedgerWriter` holds (the table its options name)."""
    with psycopg.connect(options.get("conninfo", CONNINFO)) as connection:
        found = connection.execute("SELECT to_regclass(%s)", (options["table"],)).fetchone()
        if found is None or found[0] is None:
            return None
        held = connection.execute(f"SELECT {', '.join(COLUMNS)} FROM {options['table']}").fetchall()
    return spark.createDataFrame(held, SCHEMA)
