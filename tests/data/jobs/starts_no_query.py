"""A job that reads a table and prints it: no streaming query at all."""

from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
print(spark.range(3).count())
