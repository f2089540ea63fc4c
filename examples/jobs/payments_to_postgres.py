"""Payments from Kafka into PostgreSQL, row by row from a ForeachWriter, with a ledger of the epochs written.

open() skips a (partition, epoch) the ledger already holds; close() commits the rows and the ledger row together.
"""

import os

import psycopg
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

DSN = os.environ.get("PAYMENTS_DSN", "postgresql://payments-db.prod.internal:5432/payments")
SCHEMA = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"


class PaymentsWriter:
    def open(self, partition_id, epoch_id):
        self.connection = psycopg.connect(DSN)
        self.partition_id, self.epoch_id = partition_id, epoch_id
        with self.connection.cursor() as cursor:
            # The partitions' first open() runs at once: CREATE TABLE IF NOT EXISTS is not atomic between sessions
            # (one of them fails on pg_type's unique index), so the creation is serialized until the commit below.
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('payments tables'))")
            cursor.execute(
                "CREATE TABLE IF NOT EXISTS payments (event_id TEXT, order_id TEXT, customer_id TEXT, "
                "amount DOUBLE PRECISION, status TEXT, event_time TIMESTAMP)"
            )
            cursor.execute("CREATE TABLE IF NOT EXISTS payments_epochs (partition_id INT, epoch_id BIGINT)")
            cursor.execute(
                "SELECT 1 FROM payments_epochs WHERE partition_id = %s AND epoch_id = %s", (partition_id, epoch_id)
            )
            self.seen = cursor.fetchone() is not None
        self.connection.commit()
        return not self.seen

    def process(self, row):
        self.connection.execute(
            "INSERT INTO payments VALUES (%s, %s, %s, %s, %s, %s)",
            (row.event_id, row.order_id, row.customer_id, row.amount, row.status, row.event_time),
        )

    def close(self, error):
        if error is None and not self.seen:
            self.connection.execute(
                "INSERT INTO payments_epochs VALUES (%s, %s)", (self.partition_id, self.epoch_id)
            )
            self.connection.commit()
        self.connection.close()


spark = SparkSession.builder.appName("payments-to-postgres").getOrCreate()
payments = (
    spark.readStream.format("kafka")
    .option("kafka.bootstrap.servers", "kafka.prod.internal:9092")
    .option("subscribe", "payments")
    .option("maxOffsetsPerTrigger", 20000)
    .load()
    .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("p"))
    .select("p.*")
    .where("order_id IS NOT NULL")
)
(
    payments.writeStream.foreach(PaymentsWriter())
    .option("checkpointLocation", "s3://prod/checkpoints/payments_pg/")
    .start()
    .awaitTermination()
)
