"""A job whose foreachBatch function fails on its second batch (a key its code expects is missing)."""

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

spark = SparkSession.builder.getOrCreate()


def enrich(batch_df, batch_id):
    totals = {row["status"]: row["n"] for row in batch_df.groupBy("status").agg(F.count("*").alias("n")).collect()}
    if batch_id == 1:
        print(totals["refunded-twice"])
    batch_df.write.format("delta").mode("append").save("s3://prod/delta/enriched/")


orders = (
    spark.readStream.format("kafka")
    .option("kafka.bootstrap.servers", "kafka.prod.internal:9092")
    .option("subscribe", "orders")
    .load()
    .select(F.from_json(F.col("value").cast("string"), "order_id STRING, status STRING").alias("o"))
    .select("o.*")
)
orders.writeStream.foreachBatch(enrich).option("checkpointLocation", "s3://prod/checkpoints/enriched/").start().awaitTermination()
