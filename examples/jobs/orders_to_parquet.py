"""Orders from Kafka into a Parquet folder partitioned by day, for the analysts' Athena/Trino table over it.

Run in production with:
    spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 orders_to_parquet.py
"""

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

SCHEMA = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"

spark = SparkSession.builder.appName("orders-to-parquet").getOrCreate()

orders = (
    spark.readStream.format("kafka")
    .option("kafka.bootstrap.servers", "kafka-1.prod.internal:9092,kafka-2.prod.internal:9092")
    .option("subscribe", "orders")
    .option("maxOffsetsPerTrigger", 100000)
    .load()
    .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("o"))
    .select("o.*")
    .where("order_id IS NOT NULL")
    .withColumn("day", F.to_date("event_time"))
)

(
    orders.writeStream.format("parquet")
    .option("path", "s3://prod/lake/orders_parquet/")
    .option("checkpointLocation", "s3://prod/checkpoints/orders_parquet/")
    .partitionBy("day")
    .trigger(processingTime="1 minute")
    .start()
    .awaitTermination()
)
