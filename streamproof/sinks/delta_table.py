"""A Delta table created empty, as Delta's writer would create it on its first append, and a few rows written to one
as Delta's writer would write them without its Spark job. The batch path creates the quarantine table before a
pipeline's query starts (:meth:`streamproof.pipeline.batches.BatchWriter.create_quarantine_table`), so that its
first batch commits into it, and writes a batch's few quarantined records from the driver (:func:`few_rows_file`).

Example::

    >>> create_empty_table(spark, "/data/orders_quarantine", as_nullable(rows.schema))    # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

from pyspark.sql import DataFrame, SparkSession
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


def few_rows_file(txn: Any, frame: DataFrame) -> list[Any] | None:
    """The AddFile of ``frame``'s rows written by the driver as one file of the table of ``txn``
    (``dev.streamproof.delta.FewRowsFile``: Delta's file format, options and Hadoop settings, no Spark job), with the
    statistics Delta's writer gives it: the rows, each indexed column's nulls, bounds of its strings (when none is
    longer than Delta keeps), numbers and times. None, writing nothing, when ``frame`` is not a local relation (the
    records a batch's counting gathered) or the table is not one Delta's writer fills plainly (partitions,
    constraints, generated or identity columns, column mapping, deletion vectors, chosen statistics columns): the
    caller writes through Delta's writer then. One call: a sink's batch, read from Spark's cache, is told from the
    plan as analyzed.
    ``tests/test_sink_idempotency.py::test_a_few_rows_written_by_the_driver_are_the_file_and_statistics_delta_s_writer_makes``
    compares the two.

    >>> few_rows_file(start_transaction(spark, "/data/orders_quarantine"), gathered)      # doctest: +SKIP
    [AddFile(part-00000-...-c000.snappy.parquet,...)]
    """
    jvm = frame.sparkSession._jvm
    assert jvm is not None, "a classic Spark session has a JVM"
    add = jvm.dev.streamproof.delta.FewRowsFile.addFile(txn, frame._jdf)
    return None if add is None else [add]


def table_schema(txn: Any) -> StructType:
    """The table's schema as of the transaction's snapshot (its metadata, no read of the log)."""
    return StructType.fromJson(json.loads(str(txn.snapshot().metadata().schemaString())))
