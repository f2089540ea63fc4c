"""The customers dimension the orders are enriched with: a Delta table, one row per customer and its segment.

python -m shop.customers .streamproof/tables/shop_customers            # creates it (version 0)
python -m shop.customers .streamproof/tables/shop_customers --regrade  # a new version: every segment moves
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

SEGMENTS = ("retail", "business", "wholesale")


def customers(spark: SparkSession, count: int = 10_000, *, regraded: bool = False) -> DataFrame:
    """``count`` customers (``cust-00000`` ...), the generator's ids, each in a segment; ``regraded`` moves each
    customer to the next segment (a dimension that changed)."""
    shift = 1 if regraded else 0
    segment = F.element_at(F.array(*map(F.lit, SEGMENTS)), F.pmod(F.col("id") + shift, F.lit(3)).cast("int") + 1)
    return spark.range(count).select(
        F.format_string("cust-%05d", F.col("id")).alias("customer_id"), segment.alias("segment")
    )


def write_customers(spark: SparkSession, path: str, *, regraded: bool = False) -> None:
    """Write the table at ``path`` (a new Delta version each time: the newest is what an unpinned join reads)."""
    customers(spark, regraded=regraded).write.format("delta").mode("overwrite").save(path)


if __name__ == "__main__":
    from streamproof.config import SparkSettings
    from streamproof.jvm.session import build_session

    session = build_session(SparkSettings(), app_name="shop-customers")
    write_customers(session, sys.argv[1], regraded="--regrade" in sys.argv[2:])
    session.stop()
