"""Delta source: a Delta table (or its change data feed) as a stream, e.g. bronze -> silver.

The rows have the Kafka source's shape (``topic``, ``partition``, ``offset``, ``timestamp``, ``value``), so the
transform, the sinks and verification work unchanged. ``value`` is the row as JSON (``to_json`` of its data
columns), parsed again with the pipeline's schema: a silver pipeline declares the fields it takes from bronze,
and a bronze row that does not fit goes to quarantine like any record.

Coordinates come from the data, never from the file a row sits in: Spark's Delta source exposes no file or
row position (``_metadata`` does not resolve on a Delta stream nor on a change feed; tried), and a position
would change when the table is compacted. A table streamproof wrote carries every row's Kafka coordinates
(``_src_topic``, ``_src_partition``, ``_src_offset``) and ``_src_timestamp``: the records keep them, so a silver
row names the Kafka record it came from and bronze rows are reconciled with silver rows one by one. Another
table names the columns that identify a row (``[source] coordinates``); the topic is then their values as JSON.

With ``read_change_feed = true`` a record is a change from ``starting_version`` (default 0, so the stream and
verification read the same changes): ``insert`` and ``update_postimage`` are records; ``delete`` goes to
quarantine with reason ``deleted_upstream`` (its row as raw value: the operator sees it; the sink keeps the
row); ``update_preimage`` is not a record (the value before the update, delivered earlier as its own record).
A change other than an insert gets ``@v<version, 20 digits>:<change type>`` after its topic: the same bronze row
updated twice is three records, each with its own coordinates, and they sort in commit order.

Example::

    >>> stream = read_stream(spark, spec)                    # doctest: +SKIP
    >>> stream.columns                                       # doctest: +SKIP
    ['topic', 'partition', 'offset', 'timestamp', 'value', '_source_reason']
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader

from streamproof.config import DeltaSource, PipelineSpec
from streamproof.errors import PipelineError
from streamproof.storage.location import Location
from streamproof.transform.records import COORDINATES, SOURCE_COLUMNS, SOURCE_REASON

CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP = "_change_type", "_commit_version", "_commit_timestamp"
FEED_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)
DELETED = "deleted_upstream"  # the quarantine reason of a delete in the change feed
# to_json writes times to the millisecond by default: a bronze time with microseconds would reach silver changed.
_JSON_TIMES = {
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
}


def table_path(spec: PipelineSpec) -> Location:
    """The source table's folder (a relative path is relative to the current directory at load: PipelineSpec)."""
    assert isinstance(spec.source, DeltaSource)
    return spec.resolve_path(spec.source.path)


def require_table(spec: PipelineSpec) -> None:
    """Fail in one line when the folder is not a Delta table (Spark would fail later, with a stack trace)."""
    path = table_path(spec)
    if path.reachable and not (path / "_delta_log").is_dir():
        raise PipelineError(
            f"source.path: {path} is not a Delta table (no _delta_log folder): point it at the table a pipeline "
            "writes (its [sink] path), or run that pipeline first"
        )
    for sink in spec.sink_specs:
        if sink.folder is not None and spec.resolve_path(sink.folder) == path:
            raise PipelineError(
                f"source.path: {path} is also the sink {sink.name!r}: a pipeline cannot read its output"
            )


def read_stream(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """The table's new rows (or changes) as a stream of Kafka-shaped rows."""
    source = _checked(spark, spec)
    reader = spark.readStream.format("delta")
    if source.max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", source.max_files_per_trigger)
    return _records(_feed_options(reader, source).load(str(table_path(spec))), source)


def read_batch(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """Every record the stream reads from the table as it is now (verification's view of the source)."""
    source = _checked(spark, spec)
    return _records(_feed_options(spark.read.format("delta"), source).load(str(table_path(spec))), source)


def _feed_options(reader: DataFrameReader | DataStreamReader, source: DeltaSource) -> DataFrameReader:
    if source.read_change_feed:
        reader = reader.option("readChangeFeed", "true").option("startingVersion", source.starting_version or 0)
    return reader  # type: ignore[return-value]  # both readers take the same options


def _checked(spark: SparkSession, spec: PipelineSpec) -> DeltaSource:
    """The source settings, after checking the table has what they need (one line each)."""
    source = spec.source
    assert isinstance(source, DeltaSource)
    require_table(spec)
    path = table_path(spec)
    columns = spark.read.format("delta").load(str(path)).columns
    wanted = source.coordinates or list(COORDINATES)
    missing = [column for column in wanted if column not in columns]
    if missing and source.coordinates is None:
        raise PipelineError(
            f"source.coordinates: table {path} has no {', '.join(missing)} (streamproof's coordinates: it was not "
            'written by streamproof); name the columns that identify a row, e.g. coordinates = ["order_id"]'
        )
    if missing:
        raise PipelineError(f"source.coordinates: table {path} has no column {', '.join(map(repr, missing))}")
    if source.read_change_feed:
        properties = DeltaTable.forPath(spark, str(path)).detail().first()["properties"]  # type: ignore[index]
        if str(properties.get("delta.enableChangeDataFeed", "false")).lower() != "true":
            raise PipelineError(
                f"source.read_change_feed: table {path} does not record its changes (delta.enableChangeDataFeed is "
                "not true): create it with that property (the writing pipeline's [spark.conf] "
                '"spark.databricks.delta.properties.defaults.enableChangeDataFeed" = "true"), or set '
                "read_change_feed = false"
            )
    return source


def _records(table: DataFrame, source: DeltaSource) -> DataFrame:
    """Table rows (or changes) -> Kafka-shaped rows plus the reason a change is not a deliverable record."""
    bookkeeping = {*SOURCE_COLUMNS, *FEED_COLUMNS}
    data = [F.col(f"`{column}`") for column in table.columns if column not in bookkeeping]
    if source.coordinates:
        topic = F.to_json(F.struct(*(F.col(f"`{column}`") for column in source.coordinates)))
        partition, offset = F.lit(0), F.lit(0).cast("long")
    else:
        topic, partition, offset = (F.col(column) for column in COORDINATES)
        partition, offset = partition.cast("int"), offset.cast("long")
    timestamp = F.col("_src_timestamp") if "_src_timestamp" in table.columns else F.lit(None).cast("timestamp")
    reason = F.lit(None).cast("string")
    if source.read_change_feed:
        change = F.col(CHANGE_TYPE)
        table = table.where(change != "update_preimage")
        version = F.lpad(F.col(COMMIT_VERSION).cast("string"), 20, "0")
        topic = F.when(change == "insert", topic).otherwise(F.concat(topic, F.lit("@v"), version, F.lit(":"), change))
        if "_src_timestamp" not in table.columns:
            timestamp = F.col(COMMIT_TIMESTAMP)
        reason = F.when(change == "delete", F.lit(DELETED))
    return table.select(
        topic.alias("topic"),
        partition.alias("partition"),
        offset.alias("offset"),
        timestamp.alias("timestamp"),
        F.to_json(F.struct(*data), _JSON_TIMES).cast("binary").alias("value"),
        reason.alias(SOURCE_REASON),
    )
