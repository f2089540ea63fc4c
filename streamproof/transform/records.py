"""Parse JSON (or Avro) records with the declared schema and classify each one: valid, or invalid with a reason.

Nothing is dropped silently: every source record comes out of :func:`parse_records` exactly once,
either with ``_reject_reason`` null (it belongs in the sink) or with a reason (it belongs in
quarantine, with its raw bytes and coordinates). The same function classifies the records that the
pipeline writes and the records that verification expects, so both sides agree on what is valid.

Reasons, checked in this order:

* ``empty``: null or zero-length value;
* ``not_utf8``: the bytes are not valid UTF-8 (binary garbage);
* ``invalid_json``: not a JSON object (broken syntax, an array, a bare number);
* ``schema``: a JSON object whose field does not fit the schema's type (``"amount": "abc"``: an upstream
  type change);
* ``out_of_range:<field>``: a value JSON parsing accepts but no sink should get: NaN or an infinity (``1e400``),
  a time outside years 1-9999, a summed value of ``1e18`` or more (its window's exact sum could overflow);
* ``missing_required:<field>``: a required field is absent, null or blank.

Avro records (``format = "avro"``) have ``avro`` instead of ``not_utf8``, ``invalid_json`` and ``schema``: a
record that is not one datum of the writer schema, or lacks its Confluent header (:mod:`streamproof.transform.avro`).

The classification depends only on the record's bytes, so a replayed batch classifies identically.

Example::

    >>> parsed = parse_records(kafka_df, spec.transform)            # doctest: +SKIP
    >>> valid_records(parsed).columns                              # doctest: +SKIP
    ['event_id', ..., '_src_topic', '_src_partition', '_src_offset', '_src_timestamp']
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
from collections.abc import Callable, Iterator

from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from streamproof.config import (
    COORDINATES,
    Aggregate,
    Transform,
    duration_seconds,
    schema_field_names,
    schema_field_type,
)
from streamproof.errors import ConfigError, first_line

# Where a record came from, carried by every sink row: what reconciliation matches on.
SOURCE_TIMESTAMP = "_src_timestamp"  # the record's time in its source (Kafka: its produce time, CreateTime)
SOURCE_COLUMNS = (*COORDINATES, SOURCE_TIMESTAMP)
SOURCE_COLUMNS_DDL = "_src_topic STRING, _src_partition INT, _src_offset BIGINT, _src_timestamp TIMESTAMP"
REJECT_REASON = "_reject_reason"
# A source may say itself that a row is not a deliverable record (a Delta change feed's delete): this column, when
# the source rows have it, takes precedence over every other reason.
SOURCE_REASON = "_source_reason"
RAW_VALUE = "_raw_value"
_CORRUPT = "_corrupt_record"
_PARSED = "_parsed"
_TEXT = "_text"
EXTRA_FIELDS = "_extra_fields"  # schema_evolution = "add-columns": the undeclared top-level fields, as text
# With dedup or windows on, a batch holds two branches (stateful_stream): every parsed record, and what the stateful
# operators let through (the records dedup kept, or the closed windows). This column says which branch a row is of.
BRANCH = "_branch"
ALL_RECORDS, OPERATOR_OUTPUT = 0, 1
LATE = "late"  # the quarantine reason of a record older than the watermark


def record_schema(transform: Transform) -> str:
    """The DDL of a sink row: the declared fields, then the source coordinates and timestamp.

    >>> record_schema(Transform.model_validate({"schema": "event_id STRING"}))
    'event_id STRING, _src_topic STRING, _src_partition INT, _src_offset BIGINT, _src_timestamp TIMESTAMP'
    """
    return f"{transform.schema_}, {SOURCE_COLUMNS_DDL}"


def struct_type(ddl: str) -> StructType:
    """The Spark schema of a DDL string of fields (a schema, or :func:`record_schema`); Spark parses it, so a
    session must run.

    >>> struct_type("event_id STRING, amount DOUBLE").fieldNames()     # doctest: +SKIP
    ['event_id', 'amount']
    """
    schema = StructType.fromDDL(ddl)
    assert isinstance(schema, StructType), f"not a list of fields: {ddl!r}"
    return schema


def recency(order_by: str, table: str | None = None) -> Column:
    """How recent a record is, as one value to compare: ``order_by`` (a null is oldest), then the coordinates
    (topic, partition, offset). The latest record of a key is the one with the greatest value: the rule the Delta
    MERGE, the PostgreSQL upsert (written in SQL there, :func:`streamproof.sinks.postgres.newer_than`) and
    verification all apply. ``table`` qualifies the columns (a MERGE's ``s`` and ``t``).
    """
    prefix = f"{table}." if table else ""
    value = F.col(f"{prefix}`{order_by}`")
    return F.struct(value.isNotNull(), value, *(F.col(f"{prefix}{column}") for column in COORDINATES))


def parse_records(
    kafka_records: DataFrame, transform: Transform, *, avro_schema: str | None = None, avro_header: bytes = b""
) -> DataFrame:
    """Kafka rows -> one row per record: schema fields, coordinates, raw value and reject reason.

    Works on streaming and batch DataFrames alike. Avro records (``format = "avro"``) need their writer schema,
    ``avro_schema`` (JSON), and the header each record starts with (Confluent's wire format; see
    :mod:`streamproof.transform.avro`).
    """
    if transform.format == "avro":
        assert avro_schema is not None, "Avro records are read with their writer schema (streamproof.transform.avro)"
        return _parse_avro(kafka_records, transform, avro_schema, avro_header)
    fields = schema_field_names(transform.schema_)
    schema_with_corrupt = f"{transform.schema_}, {_CORRUPT} STRING"
    decoded = kafka_records.select(
        F.col("topic").alias("_src_topic"),
        F.col("partition").alias("_src_partition"),
        F.col("offset").alias("_src_offset"),
        F.col("timestamp").alias("_src_timestamp"),
        F.col("value").alias(RAW_VALUE),
        F.col("value").cast("string").alias(_TEXT),
        *([F.col(SOURCE_REASON)] if SOURCE_REASON in kafka_records.columns else []),
    )
    parsed_value = json_records(
        kafka_records.sparkSession, F.col(_TEXT), schema_with_corrupt, {"columnNameOfCorruptRecord": _CORRUPT}
    )
    extra: list[Column] = []
    if transform.schema_evolution == "add-columns":
        declared = F.array(*(F.lit(name.lower()) for name in fields))
        every_field = F.from_json(F.col(_TEXT), "MAP<STRING, STRING>")
        parsed_value = F.struct(
            parsed_value.alias("p"),
            F.map_filter(every_field, lambda key, _: ~F.array_contains(declared, F.lower(key))).alias("x"),
        )
    # A filter on the reject reason (valid_records, quarantined_records) is pushed below a projection with
    # the alias replaced by its expression, so from_json would run once per reference (7 times a record:
    # measured 3.6x slower). A generator output cannot be inlined: explode of a one-element array
    # parses each record exactly once whatever filter follows.
    parsed = decoded.select("*", F.explode(F.array(parsed_value)).alias(_PARSED))
    if transform.schema_evolution == "add-columns":
        parsed = parsed.withColumn(EXTRA_FIELDS, F.col(f"{_PARSED}.x")).withColumn(_PARSED, F.col(f"{_PARSED}.p"))
        extra = [F.col(EXTRA_FIELDS)]
    return parsed.select(
        *SOURCE_COLUMNS,
        *[F.col(f"{_PARSED}.{name}").alias(name) for name in fields],
        *extra,
        RAW_VALUE,
        _reject_reason(
            transform,
            valid_utf8(kafka_records.sparkSession, F.col(_TEXT)),
            from_source=SOURCE_REASON in kafka_records.columns,
        ).alias(REJECT_REASON),
    )


def json_records(spark: SparkSession, text: Column, ddl: str, options: dict[str, str]) -> Column:
    """``F.from_json(text, ddl, options)`` in PERMISSIVE mode, with Jackson reading each record's UTF-8 bytes in
    place (``dev.streamproof.json.RecordsFromJson``, built by set-up with streamproof's other Java classes): the same
    rows, nulls and corrupt-record column as Spark's own ``from_json``, which hands every record to Jackson through
    a reader allocating 8 KB a record. A record the two could read differently (not UTF-8, a byte-order mark, a zero
    byte in its first four, 150 colons or more), and one the byte parser refuses, is read Spark's own way (the full
    list: the class's comment). 1,000,000 bench records parsed on a warm session: 1.23-1.28 s
    against 1.72-1.74 s with ``from_json`` (docs/performance.md, 2026-11-30).
    ``tests/test_hostile_input.py::test_records_read_from_their_bytes_are_spark_s_own_from_json_s`` compares the two
    on drawn hostile values.

    >>> parsed = kafka_df.select(json_records(spark, F.col("value").cast("string"), "id STRING", {}))  # doctest: +SKIP
    """
    jvm = spark._jvm
    assert jvm is not None, "a classic (not Connect) session"
    conf = spark.conf
    column = jvm.dev.streamproof.json.RecordsFromJson.column(
        text._jc,  # type: ignore[operator]
        ddl,
        {"mode": "PERMISSIVE", **options},
        conf.get("spark.sql.session.timeZone"),
        conf.get("spark.sql.columnNameOfCorruptRecord"),
    )
    return Column(column)  # type: ignore[call-arg]


def valid_utf8(spark: SparkSession, text: Column) -> Column:
    """Spark's ``is_valid_utf8(text)``, with a text of ASCII bytes alone told eight bytes at a time
    (``dev.streamproof.json.ValidUtf8``): Spark's own check looks at one byte at a time, and was the top frame of 7% of
    a drain's task samples. ``tests/test_hostile_input.py::test_utf8_validity_is_spark_s_own`` compares the two.

    >>> rows = kafka_df.select(valid_utf8(spark, F.col("value").cast("string")))  # doctest: +SKIP
    """
    jvm = spark._jvm
    assert jvm is not None, "a classic (not Connect) session"
    return Column(jvm.dev.streamproof.json.ValidUtf8.column(text._jc))  # type: ignore[call-arg,operator]


AVRO = "avro"  # the quarantine reason of a record that is not a datum of the writer schema (or has another header)


def _parse_avro(kafka_records: DataFrame, transform: Transform, schema_json: str, header: bytes) -> DataFrame:
    """:func:`parse_records` of Avro records: decoded by Spark's ``from_avro`` (PERMISSIVE: null for a record that
    does not decode), the declared fields taken by name from the datum (a field the datum lacks is null)."""
    from pyspark.sql.avro.functions import from_avro, to_avro  # spark-avro's: loaded for Avro pipelines only

    fields = schema_field_names(transform.schema_)
    from_source = SOURCE_REASON in kafka_records.columns
    value = F.col("value")
    framed = F.substring(value, 1, len(header)) == F.lit(header) if header else F.lit(True)
    datum = F.expr(f"substr(value, {len(header) + 1})") if header else value
    decoded = kafka_records.select(
        F.col("topic").alias("_src_topic"),
        F.col("partition").alias("_src_partition"),
        F.col("offset").alias("_src_offset"),
        F.col("timestamp").alias("_src_timestamp"),
        value.alias(RAW_VALUE),
        *([F.col(SOURCE_REASON)] if from_source else []),
        # explode of a one-element array: decoded once per record whatever filter follows (see parse_records)
        F.explode(F.array(F.when(framed, from_avro(datum, schema_json, {"mode": "PERMISSIVE"})))).alias(_PARSED),
    )
    held = set(avro_field_types(schema_json))
    parsed = F.col(_PARSED)
    # PERMISSIVE gives a record that does not decode as a datum whose fields are all null: a real all-null datum
    # encodes back to the same bytes, a failed one does not (checked for all-null rows only: cheap).
    all_null = functools.reduce(lambda a, b: a & b, (parsed.getField(name).isNull() for name in held), F.lit(True))
    undecoded = parsed.isNull() | (
        all_null & (to_avro(parsed, schema_json) != F.col(RAW_VALUE).substr(len(header) + 1, 2**31 - 1))
    )
    typed = [
        (parsed.getField(name) if name in held else F.lit(None))
        .cast(schema_field_type(transform.schema_, name) or "string")
        .alias(name)
        for name in fields
    ]
    first = F.when(F.col(SOURCE_REASON).isNotNull(), F.col(SOURCE_REASON)) if from_source else F
    reason = first.when(F.col(RAW_VALUE).isNull() | (F.length(F.col(RAW_VALUE)) == 0), F.lit("empty")).when(
        undecoded, F.lit(AVRO)
    )
    record = F.struct(*typed)
    for name, out_of_range in _range_checks(transform):
        reason = reason.when(out_of_range(record.getField(name)), F.lit(f"out_of_range:{name}"))
    for name in transform.required:
        field = record.getField(name)
        reason = reason.when(field.isNull() | (F.trim(field.cast("string")) == ""), F.lit(f"missing_required:{name}"))
    return decoded.select(
        *SOURCE_COLUMNS, *typed, RAW_VALUE, reason.otherwise(F.lit(None).cast("string")).alias(REJECT_REASON)
    )


def avro_field_types(schema_json: str) -> dict[str, str]:
    """The Spark type (DDL, upper case) of each top-level field of an Avro record schema, as ``from_avro`` reads it.

    >>> avro_field_types('{"type": "record", "name": "o", "fields": [{"name": "id", "type": "string"}, '
    ...                  '{"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]}]}')
    {'id': 'STRING', 'at': 'TIMESTAMP'}
    """
    schema = json.loads(schema_json)
    return {field["name"]: _avro_type(field["type"]) for field in schema.get("fields", [])}


_AVRO_PRIMITIVES = {
    "string": "STRING",
    "boolean": "BOOLEAN",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "bytes": "BINARY",
    "enum": "STRING",
}
_AVRO_LOGICAL = {
    "timestamp-millis": "TIMESTAMP",
    "timestamp-micros": "TIMESTAMP",
    "date": "DATE",
    "local-timestamp-millis": "TIMESTAMP_NTZ",
    "local-timestamp-micros": "TIMESTAMP_NTZ",
}


def _avro_type(kind: object) -> str:
    if isinstance(kind, list):  # a union: ["null", T] is a nullable T; other unions are Spark structs
        branches = [branch for branch in kind if branch != "null"]
        return _avro_type(branches[0]) if len(branches) == 1 else "STRUCT"
    if isinstance(kind, dict):
        if kind.get("logicalType") in _AVRO_LOGICAL:
            return _AVRO_LOGICAL[kind["logicalType"]]
        if kind.get("logicalType") == "decimal":
            return f"DECIMAL({kind.get('precision')},{kind.get('scale', 0)})"
        return _avro_type(kind.get("type"))
    return _AVRO_PRIMITIVES.get(str(kind), str(kind).upper())


def check_avro_fields(transform: Transform, schema_json: str) -> None:
    """Refuse a ``required`` field the Avro schema lacks (every record would be quarantined), and a declared field
    whose type differs from the Avro field's (a cast would turn values into nulls).

    >>> check_avro_fields(Transform.model_validate({"schema": "id STRING", "required": ["id"]}),
    ...                   '{"type": "record", "name": "o", "fields": []}')
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: transform.required: 'id' is not a field of the Avro schema ()
    >>> check_avro_fields(Transform.model_validate({"schema": "id BIGINT"}),
    ...                   '{"type": "record", "name": "o", "fields": [{"name": "id", "type": "string"}]}')
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: transform.schema: id is BIGINT but the Avro schema's id is STRING: declare STRING
    """
    held = avro_field_types(schema_json)
    for name in transform.required:
        if name not in held:
            raise ConfigError(f"transform.required: {name!r} is not a field of the Avro schema ({', '.join(held)})")
    for name in schema_field_names(transform.schema_):
        declared = re.sub(r"\s+", "", (schema_field_type(transform.schema_, name) or "").upper())
        if name in held and declared != held[name] and {declared, held[name]} != {"TIMESTAMP", "TIMESTAMP_LTZ"}:
            raise ConfigError(
                f"transform.schema: {name} is {declared} but the Avro schema's {name} is {held[name]}: "
                f"declare {held[name]}"
            )


def _reject_reason(transform: Transform, valid_text: Column, *, from_source: bool = False) -> Column:
    parsed, text = F.col(_PARSED), F.col(_TEXT)
    first = F.when(F.col(SOURCE_REASON).isNotNull(), F.col(SOURCE_REASON)) if from_source else F
    reason = (
        first.when(F.col(RAW_VALUE).isNull() | (F.length(F.col(RAW_VALUE)) == 0), F.lit("empty"))
        .when(~valid_text, F.lit("not_utf8"))
        .when(parsed.isNull(), F.lit("invalid_json"))
        .when(
            parsed.getField(_CORRUPT).isNotNull(),
            # json_object_keys is null for text that is not a JSON object: broken syntax vs a type misfit.
            F.when(F.json_object_keys(text).isNull(), F.lit("invalid_json")).otherwise(F.lit("schema")),
        )
    )
    for name, out_of_range in _range_checks(transform):
        reason = reason.when(out_of_range(parsed.getField(name)), F.lit(f"out_of_range:{name}"))
    for name in transform.required:
        value = parsed.getField(name)
        reason = reason.when(value.isNull() | (F.trim(value.cast("string")) == ""), F.lit(f"missing_required:{name}"))
    return reason.otherwise(F.lit(None).cast("string"))


# A summed value at or beyond this magnitude could overflow the exact DECIMAL(38, 10) sum of a window.
MAX_SUMMED_MAGNITUDE = 1e18


def _range_checks(transform: Transform) -> list[tuple[str, Callable[[Column], Column]]]:
    """Values JSON parsing accepts but no sink should get: NaN and infinities (``1e400`` parses as Infinity),
    times outside years 1-9999 (which Python, PostgreSQL drivers and many readers cannot represent), and, for
    a window's summed columns, magnitudes whose exact sum could overflow."""
    summed = set(transform.aggregate.sum) if transform.aggregate is not None else set()
    checks: list[tuple[str, Callable[[Column], Column]]] = []
    for name in schema_field_names(transform.schema_):
        kind = (schema_field_type(transform.schema_, name) or "").split("(")[0]
        if kind in ("DOUBLE", "FLOAT", "REAL"):
            checks.append((name, lambda v: F.isnan(v) | (F.abs(v) == float("inf"))))
        elif kind in ("TIMESTAMP", "TIMESTAMP_LTZ", "TIMESTAMP_NTZ", "DATE"):
            checks.append((name, lambda v: (F.year(v) < 1) | (F.year(v) > 9999)))
        if name in summed:
            checks.append((name, lambda v: F.abs(v.cast("double")) >= MAX_SUMMED_MAGNITUDE))
    return checks


_COLUMN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def with_extra_columns(rows: DataFrame) -> DataFrame:
    """``schema_evolution = "add-columns"``: the undeclared fields of the batch's records as STRING columns.

    The new columns are the field names found in this batch (sorted, so a replayed batch makes the same
    ones); a field whose name is not a plain column name (letters, digits, ``_``), starts with ``_``, or equals
    a column's name in another case, is not carried (it stays in the source record only). Delta's
    schema merging adds them to the table; records without them get nulls, and so do the rows written before.

    >>> with_extra_columns(valid_records(parsed)).columns[-1]                     # doctest: +SKIP
    'coupon_code'
    """
    if EXTRA_FIELDS not in rows.columns:
        return rows
    found = rows.select(F.explode(F.map_keys(F.col(EXTRA_FIELDS))).alias("k")).distinct().collect()
    kept = [c for c in rows.columns if c != EXTRA_FIELDS]
    taken = {c.lower() for c in kept}
    names: dict[str, str] = {}  # by lower case: Delta's column names ignore case ("Channel" and "channel": the first)
    for name in sorted(row["k"] for row in found):
        # "_" starts streamproof's own columns (coordinates, raw value): a field so named is not carried.
        if _COLUMN_NAME.match(name) and not name.startswith("_") and name.lower() not in taken:
            names.setdefault(name.lower(), name)
    return rows.select(*kept, *(F.col(EXTRA_FIELDS).getItem(name).alias(name) for name in sorted(names.values())))


def with_derived_columns(rows: DataFrame, transform: Transform) -> DataFrame:
    """The sink rows with ``[transform] columns`` added, each a Spark SQL expression over the row.

    >>> with_derived_columns(valid_records(parsed), spec.transform).columns[-1]          # doctest: +SKIP
    'amount_cents'
    """
    return rows.select("*", *(F.expr(sql).alias(name) for name, sql in transform.columns.items()))


def sink_rows_schema(spark: SparkSession, transform: Transform, *, derived: bool = True) -> StructType:
    """The Spark schema of the rows a sink is given: the record's fields, then (``derived``) the ``[transform]
    columns`` as Spark types them.

    >>> sink_rows_schema(spark, spec.transform).fieldNames()[-1]                         # doctest: +SKIP
    'amount_cents'
    """
    schema = struct_type(record_schema(transform))
    if derived and transform.columns:
        schema = with_derived_columns(spark.createDataFrame([], schema), transform).schema
    return schema


@contextlib.contextmanager
def users_analysis_errors(what: str) -> Iterator[None]:
    """Spark's analysis error of the user's code or expression (a column that is not there, a bad query) as one
    :class:`~streamproof.errors.ConfigError` line starting with ``what``. PySpark logs every analysis error it raises
    with the JVM stack (logger SQLQueryContextLogger): silenced meanwhile, the one line says it."""
    context_logger = logging.getLogger("SQLQueryContextLogger")
    try:
        context_logger.disabled = True
        yield
    except PySparkException as error:
        raise ConfigError(f"{what}: {first_line(error)}") from None
    finally:
        context_logger.disabled = False


def check_derived_columns(spark: SparkSession, transform: Transform, *, exactly_once: bool) -> None:
    """Analyse each derived column against the record's columns before the query starts: an expression Spark
    cannot resolve, or (exactly-once) one Catalyst knows to be nondeterministic (``rand()``, ``uuid()``, a
    nondeterministic UDF), is a :class:`~streamproof.errors.ConfigError` naming the key."""
    empty = spark.createDataFrame([], record_schema(transform))
    for name, sql in transform.columns.items():
        with users_analysis_errors(f"transform.columns.{name}: {sql!r} cannot be evaluated"):
            plan = empty.selectExpr(f"{sql} AS `{name}`")._jdf.queryExecution().analyzed()
        if exactly_once and not plan.deterministic():
            raise ConfigError(
                f"transform.columns.{name}: {sql!r} is nondeterministic, so a batch replayed after a crash would write "
                "other values and exactly-once cannot hold; derive it from the record's own fields"
            )


def valid_records(parsed: DataFrame) -> DataFrame:
    """The records that belong in the sink: schema fields plus source coordinates."""
    data_columns = [c for c in parsed.columns if c not in (*SOURCE_COLUMNS, RAW_VALUE, REJECT_REASON)]
    return parsed.where(F.col(REJECT_REASON).isNull()).select(*data_columns, *SOURCE_COLUMNS)


def quarantined_records(parsed: DataFrame) -> DataFrame:
    """The invalid records: coordinates, reason and raw bytes (binary, since they may not be text)."""
    return quarantine_columns(parsed.where(F.col(REJECT_REASON).isNotNull()))


def quarantine_columns(rejected: DataFrame) -> DataFrame:
    """The quarantine table's columns of records known to be invalid (a batch's rejected records its counting
    gathered: no filter to plan again).

    >>> quarantine_columns(gathered).columns                                             # doctest: +SKIP
    ['_src_topic', '_src_partition', '_src_offset', '_src_timestamp', 'reason', 'raw_value']
    """
    return rejected.select(
        *SOURCE_COLUMNS,  # the extra fields of schema evolution stay in raw_value
        F.col(REJECT_REASON).alias("reason"),
        F.col(RAW_VALUE).alias("raw_value"),
    )


def stateful_stream(parsed: DataFrame, transform: Transform) -> DataFrame:
    """With dedup or windows on, both branches a batch needs, as one stream (column :data:`BRANCH`).

    Spark's stateful operators drop late records (older than the watermark) and duplicates without a trace, so
    they cannot be the only path: every parsed record also comes through untouched (``ALL_RECORDS``), and the
    batch writer takes invalid records and late ones from that branch (:func:`late_condition`), the sink's
    rows from the operators' branch (``OPERATOR_OUTPUT``: the records dedup kept, or the closed windows).
    Invalid records never enter the operators (their key may be null or shared). The operators' state lives
    in the checkpoint, so a replayed batch drops, and emits, exactly what it did before.

    >>> stateful_stream(parse_records(kafka_stream, spec.transform), spec.transform)   # doctest: +SKIP
    """
    if transform.watermark is None:
        return parsed
    column, delay = transform.watermark
    kept = parsed.where(F.col(REJECT_REASON).isNull()).withWatermark(column, delay)
    dedup, aggregate = transform.dedup, transform.aggregate
    if dedup is not None:
        if dedup.method == "within-watermark":
            kept = kept.dropDuplicatesWithinWatermark(dedup.columns)
        else:
            kept = kept.dropDuplicates(dedup.key_columns)
    if aggregate is not None:
        kept = window_rows(kept, aggregate, column)
    return parsed.withColumn(BRANCH, F.lit(ALL_RECORDS)).unionByName(
        kept.withColumn(BRANCH, F.lit(OPERATOR_OUTPUT)), allowMissingColumns=True
    )


EXACT_SUM = "DECIMAL(38, 10)"


def window_rows(records: DataFrame, aggregate: Aggregate, event_time: str) -> DataFrame:
    """One row per (tumbling window, ``by`` group): :attr:`Aggregate.output_columns`. Sums are exact decimals.

    Works on a batch DataFrame too: verification recomputes the windows with this same function.
    """
    measures = [F.sum(F.col(c).cast(EXACT_SUM)).alias(f"sum_{c}") for c in aggregate.sum]
    if aggregate.count:
        measures.append(F.count(F.lit(1)).alias("events"))
    grouped = records.groupBy(F.window(F.col(event_time), aggregate.window).alias("window"), *aggregate.by)
    return grouped.agg(*measures).select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        *aggregate.by,
        *(c for c in aggregate.output_columns[2 + len(aggregate.by) :]),
    )


def window_end(event_time: str, size: str) -> Column:
    """The end of the tumbling window of ``size`` that holds ``event_time`` (windows aligned on the epoch, as
    Spark's ``window``), null for a null time.

    Not ``F.window(...).end``: outside an aggregation Spark rewrites ``window`` into a projection *and a filter*
    that drops every row whose time is null, which would silently remove records from a count.
    """
    size_us = int(round(duration_seconds(size) * 1_000_000))
    micros = F.unix_micros(F.col(event_time))
    return F.timestamp_micros(micros - F.pmod(micros, F.lit(size_us)) + F.lit(size_us))


def late_condition(transform: Transform, watermark_ms: int) -> Column:
    """True for a valid record that the pipeline's stateful operators drop as late in a batch whose late-event
    watermark is ``watermark_ms`` (Spark judges the late records of batch N against the watermark of batch N-1,
    :func:`streamproof.checkpoint.late_event_watermark_ms`). Spark's own predicates: dedup drops a record whose
    event time is at or before the watermark; a window aggregation one whose window ends at or before it (a
    record behind the watermark still counts in a window that is open). A null event time is never late.

    >>> late_condition(spec.transform, 1767225600000)                                   # doctest: +SKIP
    Column<'((event_time <= timestamp_millis(1767225600000)) AND (_reject_reason IS NULL))'>
    """
    if transform.watermark is None or watermark_ms <= 0:  # no watermark (yet: first batch): nothing is late
        return F.lit(False)
    is_late = behind_watermark(transform, F.lit(watermark_ms))
    return F.coalesce(is_late & F.col(REJECT_REASON).isNull(), F.lit(False))


def behind_watermark(transform: Transform, watermark_ms: Column) -> Column:
    """Spark's late predicate for the pipeline's stateful operators, against a watermark in epoch milliseconds:
    the event time (dedup) or its window's end (windows without dedup) at or before it. The batch writer
    (:func:`late_condition`) and verification (:func:`streamproof.reconcile.late_flags`) both use it."""
    assert transform.watermark is not None
    column = transform.watermark[0]
    if transform.dedup is not None or transform.aggregate is None:
        behind = F.col(column)
    else:
        behind = window_end(column, transform.aggregate.window)
    return behind <= F.timestamp_millis(watermark_ms)
