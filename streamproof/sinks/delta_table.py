"""A Delta table created empty, as Delta's writer would create it on its first append: the batch path creates the
quarantine table before a pipeline's query starts
(:meth:`streamproof.pipeline.batches.BatchWriter.create_quarantine_table`), so that its first batch commits into it.

Example::

    >>> create_empty_table(spark, "/data/orders_quarantine", as_nullable(rows.schema))    # doctest: +SKIP
    True
"""

from __future__ import annotations

import time
from typing import cast

from pyspark.sql import SparkSession
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType


def create_empty_table(spark: SparkSession, path: str, schema: StructType) -> bool:
    """Create the Delta table at ``path``, empty, of ``schema``, unpartitioned, in one commit through Delta's
    transaction (its protocol and the session's default table properties as Delta's writer gives a new table); False,
    committing nothing, when a table is there already. Two creating at once: one commits, the other's commit is
    Delta's conflict (a table created concurrently).

    >>> create_empty_table(spark, "/data/orders", rows.schema)                            # doctest: +SKIP
    True
    """
    jvm = spark._jvm
    assert jvm is not None, "a classic Spark session has a JVM"
    delta = jvm.org.apache.spark.sql.delta
    txn = delta.DeltaLog.forTable(spark._jsparkSession, path).startTransaction()
    if int(txn.readVersion()) >= 0:
        return False
    as_scala = jvm.scala.jdk.javaapi.CollectionConverters.asScala
    defaults = delta.actions.Metadata
    metadata = delta.actions.Metadata(
        getattr(defaults, "apply$default$1")(),  # a new table id
        None,
        None,
        getattr(defaults, "apply$default$4")(),  # Parquet files
        schema.json(),
        as_scala(jvm.java.util.ArrayList()).toList(),  # no partition columns
        getattr(defaults, "apply$default$7")(),  # no properties of its own: the session's defaults apply
        jvm.scala.Some(jvm.java.lang.Long.valueOf(str(int(time.time() * 1000)))),  # created now, as the writer says
    )
    txn.updateMetadataForNewTable(metadata)
    create = getattr(delta, "DeltaOperations$CreateTable")(metadata, False, False, jvm.scala.Option.empty())
    txn.commit(as_scala(jvm.java.util.ArrayList()).toList(), create)
    return True


def as_nullable(schema: StructType) -> StructType:
    """``schema`` with every column, field, array element and map value nullable: what Delta's writer makes of a
    new table's schema (``StructType.asNullable``).

    >>> from pyspark.sql.types import ArrayType, LongType, StructField
    >>> rows = StructType([StructField("ids", ArrayType(LongType(), containsNull=False), nullable=False)])
    >>> as_nullable(rows).simpleString(), as_nullable(rows)["ids"].nullable, as_nullable(rows)["ids"].dataType
    ('struct<ids:array<bigint>>', True, ArrayType(LongType(), True))
    """
    return cast(StructType, _nullable(schema))


def _nullable(kind: DataType) -> DataType:
    if isinstance(kind, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True, f.metadata) for f in kind.fields])
    if isinstance(kind, ArrayType):
        return ArrayType(_nullable(kind.elementType), True)
    if isinstance(kind, MapType):
        return MapType(_nullable(kind.keyType), _nullable(kind.valueType), True)
    return kind
