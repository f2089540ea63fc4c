"""Orders from Kafka into the bronze Delta table: the "end-to-end exactly-once pipeline" the tutorials teach.

Run in production with:
    spark-submit --packages io.delta:delta-spark_2.13:4.0.0,org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 \
        orders_bronze.py
"""

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType

BROKERS = "broker1.prod.internal:9092,broker2.prod.internal:9092"
CHECKPOINT = "s3://prod/checkpoints/bronze/orders/"
TABLE = "s3://prod/delta/bronze/orders/"

ORDER = StructType(
    [
        StructField("event_id", StringType()),
        StructField("order_id", StringType()),
        StructField("customer_id", StringType()),
        StructField("amount", DoubleType()),
        StructField("status", StringType()),
        StructField("event_time", TimestampType()),
    ]
)


def main() -> None:
    spark = (
        SparkSession.builder.appName("orders-bronze")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", "8")
        .getOrCreate()
    )

    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", BROKERS)
        .option("subscribe", "orders")
        .option("startingOffsets", "latest")
        .option("maxOffsetsPerTrigger", 50000)
        .option("failOnDataLoss", "true")
        .load()
    )

    orders = (
        raw.select(F.from_json(F.col("value").cast("string"), ORDER).alias("order"))
        .select("order.*")
        .filter(F.col("order_id").isNotNull() & (F.col("amount") > 0))
        .withColumn("ingested_at", F.current_timestamp())
    )

    query = (
        orders.writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", CHECKPOINT)
        .trigger(processingTime="30 seconds")
        .queryName("orders_bronze")
        .start(TABLE)
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
