"""Orders enriched with the customers table, a price band from a Python UDF, cents from a pandas UDF, and one row
per line item.

streamproof calls :func:`enrich` on each batch's valid order events (their fields and the ``_src_*`` lineage
columns), with the ``[[lookups]]`` tables of the pipeline file as DataFrames by name. Every value comes from
the record and the lookups: a batch replayed after a crash gives the same rows (streamproof checks it).
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T


def in_cents(amount: pd.Series) -> pd.Series:
    """A pandas UDF's function: a whole Arrow batch of amounts at once, in the Python workers (made a UDF where it is
    used: PySpark makes a pandas UDF only while a session runs, and this module imports without one)."""
    return (amount * 100).round().astype("int64")


@F.udf(returnType=T.StringType(), useArrow=False)
def price_band(amount):  # type: ignore[no-untyped-def]  # (Spark reads type hints as a pandas UDF's)
    """A plain Python UDF: runs in Spark's Python workers, which import this module from the zip streamproof ships."""
    if amount is None:
        return None
    return "small" if amount < 50 else "medium" if amount < 250 else "large"


def enrich(records: DataFrame, lookups: dict[str, DataFrame]) -> DataFrame:
    """Cancelled orders dropped; each order's customer segment joined (a stream-static join on the lookup);
    its amount split over 1-3 line items, one row each (``line_id`` = order, line number).

    >>> enrich(records, {"customers": customers}).columns[:3]                    # doctest: +SKIP
    ['line_id', 'order_id', 'customer_id']
    """
    customers = lookups["customers"].select("customer_id", "segment")
    lines = F.lit(1) + F.pmod(F.col("amount_cents"), F.lit(3))
    orders = (
        records.where(F.col("status") != "cancelled")
        .withColumn("amount_cents", F.pandas_udf(in_cents, "bigint")(F.col("amount")))  # type: ignore[call-overload]
        .withColumn("line_no", F.explode(F.sequence(F.lit(1), lines)))
    )
    return orders.join(customers, "customer_id", "left").select(
        F.concat_ws("-", "order_id", F.col("line_no").cast("string")).alias("line_id"),
        "order_id",
        "customer_id",
        "status",
        "event_time",
        "line_no",
        (F.col("amount_cents") / lines / 100).cast("decimal(12, 4)").alias("line_amount"),
        price_band(F.col("amount")).alias("price_band"),
        F.coalesce(F.col("segment"), F.lit("unknown")).alias("segment"),
        "_src_topic",
        "_src_partition",
        "_src_offset",
        "_src_timestamp",
    )


def with_a_random_discount(records: DataFrame) -> DataFrame:
    """Not replayable: a replay draws other discounts (streamproof refuses it under exactly-once)."""
    return records.withColumn("discount", F.rand())


@F.udf(returnType=T.LongType(), useArrow=False)
def _now_ns(_):  # type: ignore[no-untyped-def]
    import time

    return time.time_ns()


def stamped_by_the_clock(records: DataFrame) -> DataFrame:
    """Not replayable either, and Spark's plan does not say so: a UDF that reads the clock (caught by applying the
    function twice to the same sample of the first batch)."""
    return records.withColumn("seen_ns", _now_ns(F.col("event_id")))


def without_lineage(records: DataFrame) -> DataFrame:
    """Drops the ``_src_*`` columns: refused, the rows could not be matched to their records."""
    return records.select("order_id", "amount")


def first_event_per_order(records: DataFrame) -> DataFrame:
    """Refused under exactly-once: which event of an order it keeps depends on the order the batch's records come in
    (a replay, or verification, gets them in another)."""
    return records.dropDuplicates(["order_id"])
