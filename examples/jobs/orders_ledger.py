"""Orders appended to a Delta table from foreachBatch, with a control table of the batches already processed.

The pattern the tutorials call "idempotent writes with a control table": skip a batch whose id is in the control
table, else append the batch, then record its id. (The two appends are two Delta commits.)
"""

import sys
from datetime import datetime, timezone

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

DATA = "s3://prod/delta/silver/orders/"
CONTROL = "s3://prod/delta/silver/_processed_batches/"
SCHEMA = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"


def idempotent_write(batch_df, batch_id):
    spark = batch_df.sparkSession
    try:
        done = spark.read.format("delta").load(CONTROL).filter(F.col("batch_id") == batch_id).count() > 0
    except Exception:  # the control table does not exist yet
        done = False
    if done:
        print(f"batch {batch_id} already processed, skipping")
        return
    # Atomic if using Delta: the data and the control row commit together.
    batch_df.write.format("delta").mode("append").save(DATA)
    control = spark.createDataFrame([(batch_id, datetime.now(timezone.utc))], "batch_id LONG, processed_at TIMESTAMP")
    control.write.format("delta").mode("append").save(CONTROL)


def main(environment: str) -> None:
    spark = SparkSession.builder.appName(f"orders-ledger-{environment}").getOrCreate()
    orders = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", "b-1.msk-prod.internal:9092,b-2.msk-prod.internal:9092")
        .option("subscribe", "orders")
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("o"))
        .select("o.*")
        .dropna(subset=["order_id"])
    )
    query = (
        orders.writeStream.foreachBatch(idempotent_write)
        .option("checkpointLocation", "s3://prod/checkpoints/orders_ledger/")
        .queryName("orders_ledger")
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "prod")
