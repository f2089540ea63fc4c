"""Orders read once, written twice: a bronze Delta table in the catalog (toTable) and an enriched Kafka topic
(Spark's own Kafka sink), two queries waited on with awaitAnyTermination()."""

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

spark = SparkSession.builder.appName("orders-fanout").getOrCreate()
spark.sql("CREATE DATABASE IF NOT EXISTS bronze")

orders = (
    spark.readStream.format("kafka")
    .option("kafka.bootstrap.servers", "kafka.prod.internal:9092")
    .option("subscribe", "orders")
    .load()
    .select(F.from_json(F.col("value").cast("string"), "order_id STRING, amount DOUBLE, status STRING").alias("o"))
    .select("o.*")
    .where("order_id IS NOT NULL")
)

(
    orders.writeStream.format("delta")
    .queryName("bronze")
    .option("checkpointLocation", "s3://prod/checkpoints/bronze/")
    .toTable("bronze.orders")
)
(
    orders.select(F.col("order_id").alias("key"), F.to_json(F.struct("order_id", "status")).alias("value"))
    .writeStream.format("kafka")
    .queryName("to_kafka")
    .option("kafka.bootstrap.servers", "kafka.prod.internal:9092")
    .option("topic", "orders-enriched")
    .option("checkpointLocation", "s3://prod/checkpoints/to_kafka/")
    .start()
)
spark.streams.awaitAnyTermination()
