"""Hostile input never crashes anything and is always accounted for; bad pipeline files fail in one line.

* Property, in process: hypothesis draws batches of hostile Kafka values (null, empty, invalid UTF-8, binary,
  broken and deeply nested JSON, values of every JSON type in every field, numbers beyond any range, NaN and
  infinities, timestamps in other formats and outside years 1-9999, undeclared and reserved field names);
  each comes out of the transform exactly once, valid or with a known reason.
* Property, on a real run: a drawn topic of such records (null and random keys, plus one 1 MB message) go
  through ``streamproof run`` (Kafka -> Delta, exactly-once, schema evolution on); verification finds
  every record in the sink or in quarantine: 0 lost, 0 duplicated, 0 unexpected, the identity holding.
* Property, config loader: any drawn TOML document (known keys with values of any type, or random text)
  either loads or raises ConfigError with one line; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from conftest import assert_every_sink_clean, run_cli, write_pipeline
from streamproof.config import Transform, dump_pipeline, load_pipeline, parse_pipeline
from streamproof.errors import ConfigError

SCHEMA = "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, event_time TIMESTAMP"
REASONS = ("empty", "not_utf8", "invalid_json", "schema", "out_of_range:", "missing_required:")

any_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**40), 10**40) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
timestamps = st.sampled_from([
    "2026-01-01T00:00:00Z", "2026-01-01 00:00:00", "2026-01-01T00:00:00.123456+02:00", "01/02/2026", "yesterday",
    "+275760-09-13T00:00:00Z", "0000-12-31T00:00:00Z", "9999-12-31T23:59:59.999Z", "", "2026-02-30T00:00:00Z",
]) | st.integers(-(10**13), 10**13)  # fmt: skip
field_values = {
    "event_id": st.text(max_size=8) | st.none() | st.just("  ") | any_json,
    "order_id": st.text(min_size=1, max_size=8) | st.none() | any_json,
    "amount": st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**400), 10**400) | any_json,
    "event_time": timestamps | any_json,
    "status": st.text(max_size=4) | any_json,
}
undeclared = st.dictionaries(
    st.sampled_from(["channel", "Channel", "_src_offset", "_raw_value", "amount ", "bad key", "EVENT_ID", "coupon"]),
    any_json, max_size=3,
)  # fmt: skip


@st.composite
def json_records(draw: st.DrawFn) -> bytes:
    record = {name: draw(values) for name, values in field_values.items() if draw(st.booleans()) or name.endswith("id")}
    record.update(draw(undeclared))
    return json.dumps(record, allow_nan=True).encode()


hostile_values = st.one_of(
    json_records(),
    json_records(),
    st.none(),
    st.just(b""),
    st.binary(max_size=40),
    json_records().map(lambda value: value[: max(1, len(value) // 2)]),  # cut short
    st.integers(1, 3000).map(lambda depth: b'{"event_id":"deep","order_id":"o","d":' + b"[" * depth + b"]" * depth
                             + b"}"),
    st.sampled_from([b"null", b"[]", b"42", b'"text"', b"\xef\xbb\xbf{}", b'{"event_id":"x","order_id":"o"} tail']),
)  # fmt: skip


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=st.lists(hostile_values, min_size=1, max_size=60))
def test_every_hostile_record_gets_exactly_one_outcome(spark: Any, values: list[bytes | None]) -> None:
    from streamproof.transform.records import parse_records, quarantined_records, valid_records, with_extra_columns

    transform = Transform.model_validate({"schema": SCHEMA, "required": ["event_id", "order_id"],
                                          "schema_evolution": "add-columns"})  # fmt: skip
    rows = [("t", 0, offset, None, value) for offset, value in enumerate(values)]
    frame = spark.createDataFrame(rows, "topic STRING, partition INT, offset LONG, timestamp TIMESTAMP, value BINARY")
    parsed = parse_records(frame, transform).cache()
    try:
        reasons = [row["_reject_reason"] for row in parsed.select("_reject_reason").collect()]
        assert len(reasons) == len(values)
        assert all(reason is None or reason.startswith(REASONS) for reason in reasons), set(reasons)
        valid = with_extra_columns(valid_records(parsed))
        assert valid.count() + quarantined_records(parsed).count() == len(values)
        assert len({c.lower() for c in valid.columns}) == len(valid.columns)  # no clash with carried fields
    finally:
        parsed.unpersist()


# Values where Jackson reading bytes and Jackson reading Spark's decoded characters could part: byte-order marks, zero
# bytes where Jackson's byte reader looks for UTF-16 and UTF-32, JSON in UTF-16, bad UTF-8 inside a string, 2-, 3- and
# 4-byte characters, control characters, escapes.
BYTE_EDGES = [
    b"\xef\xbb\xbf{\"event_id\":\"e\",\"order_id\":\"o\"}", b"\xfe\xff\x00{", b"\xff\xfe{\x00",
    b"{\x00\"event_id\":\"e\"}", b"\x00\x00\x00{", b"\x00{\x00\"",
    '{"event_id":"e","order_id":"o"}'.encode("utf-16-le"), '{"event_id":"e","order_id":"o"}'.encode("utf-16"),
    '{"event_id":"e","order_id":"o"}'.encode("utf-32"), b'{"event_id":"\xc3(","order_id":"o"}',
    b'{"event_id":"\xed\xa0\x80","order_id":"o"}', b'{"event_id":"\xf0\x28\x8c\x28","order_id":"o"}',
    '{"event_id":"é€😀","order_id":"ø","status":"\u00e9"}'.encode(), b'{"event_id":"a\tb","order_id":"\x01"}',
    b'{"event_id":"\\ud83d\\ude00","order_id":"\\u0000"}', b" \n{\"event_id\":\"e\",\"order_id\":\"o\"} \n",
    b'{"event_id":"e","order_id":"o","amount":1e400,"event_time":"2026-01-01T00:00:00Z"}',
    # Refused by Jackson's byte parser, read by its character parser: a lone surrogate escaped in a field name, names
    # of over 50,000 bytes but not characters. And one its character parser refuses: 150 names sharing a hash.
    b'{"event_id":"e","\\ud800":1}', b"{'\\udc00':1}", b'{"' + b"\\u0800" * 16_667 + b'":1}',
    b'{"event_id":"e","' + "\u00e9".encode() * 25_001 + b'":1}',
    b"{" + b",".join(b'"%s":0' % "".join(p).encode() for p in itertools.product(("aB", "b!"), repeat=9)) + b"}",
]  # fmt: skip


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=st.lists(hostile_values | st.sampled_from(BYTE_EDGES) | st.binary(max_size=12), min_size=1, max_size=60))
@example(values=BYTE_EDGES)
def test_records_read_from_their_bytes_are_spark_s_own_from_json_s(spark: Any, values: list[bytes | None]) -> None:
    """streamproof.transform.records.json_records (Jackson reading each record's bytes, RecordsFromJson) gives, for
    every value, the row Spark's own from_json gives: the fields, their nulls and the corrupt-record column."""
    from pyspark.sql import functions as F

    from streamproof.transform.records import json_records

    ddl = f"{SCHEMA}, _corrupt_record STRING"
    frame = spark.createDataFrame(list(enumerate(values)), "offset LONG, value BINARY")
    text = F.col("value").cast("string")
    spark_s = F.from_json(text, ddl, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"})
    ours = json_records(spark, text, ddl, {"columnNameOfCorruptRecord": "_corrupt_record"})
    # As text, every field's null included: a time of year 0 has no Python datetime, and NaN is not NaN in Python.
    rows = frame.select("offset", spark_s.cast("string").alias("theirs"), ours.cast("string").alias("ours"))
    compared = rows.orderBy("offset").collect()
    assert len(compared) == len(values)
    for row in compared:
        assert row["ours"] == row["theirs"], (values[row["offset"]], row["theirs"], row["ours"])


# Bytes a check of eight at a time could misjudge: a non-ASCII byte at each place of a word and of the tail, a
# character cut at a word's end, overlong forms, encoded surrogates, code points past U+10FFFF, bytes never valid.
UTF8_EDGES = [
    b"", b"a" * 7, b"a" * 8, b"a" * 9, *(b"a" * i + b"\x80" + b"a" * (15 - i) for i in range(16)),
    *(b"a" * i + "\u00e9".encode() + b"a" * (14 - i) for i in range(15)), b"a" * 7 + "\U0001f600".encode(),
    b"a" * 8 + b"\xe2\x82", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff", "\u20ac".encode() * 3,
]  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(values=st.lists(st.binary(max_size=40) | st.text(max_size=20).map(str.encode) | st.sampled_from(UTF8_EDGES),
                       min_size=1, max_size=60))  # fmt: skip
@example(values=UTF8_EDGES)
def test_utf8_validity_is_spark_s_own(spark: Any, values: list[bytes]) -> None:
    """streamproof.transform.records.valid_utf8 (ASCII told eight bytes at a time, ValidUtf8) says of every value
    what Spark's own is_valid_utf8 says: what sends a record to quarantine as not_utf8."""
    from pyspark.sql import functions as F

    from streamproof.transform.records import valid_utf8

    frame = spark.createDataFrame([*enumerate(values), (len(values), None)], "offset LONG, value BINARY")
    text = F.col("value").cast("string")
    rows = frame.select("offset", F.expr("is_valid_utf8(CAST(value AS STRING))").alias("theirs"),
                        valid_utf8(spark, text).alias("ours")).collect()  # fmt: skip
    assert len(rows) == len(values) + 1
    for row in rows:
        assert row["ours"] == row["theirs"], ([*values, None][row["offset"]], row["theirs"], row["ours"])


BIG_MESSAGE = b'{"event_id":"big","order_id":"o","pad":"' + b"x" * (1 << 20) + b'"}'


@settings(max_examples=1, deadline=None, phases=(Phase.generate,), suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])  # fmt: skip
@given(records=st.lists(st.tuples(st.none() | st.binary(max_size=8), hostile_values), min_size=50, max_size=300))
def test_a_real_run_accounts_for_every_hostile_record(
    kafka_broker: Any, spark: Any, tmp_path_factory: pytest.TempPathFactory, records: list[tuple[Any, Any]]
) -> None:
    from confluent_kafka import Producer

    from streamproof.kafka_client import ensure_topic

    workdir = tmp_path_factory.mktemp("hostile")
    topic = f"hostile-{workdir.name}"
    ensure_topic(kafka_broker.bootstrap_servers, topic, 2, config={"max.message.bytes": str(3 << 20)})
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "message.max.bytes": 3 << 20,
                         "enable.idempotence": True})  # fmt: skip
    for index, (key, value) in enumerate([*records, (None, BIG_MESSAGE)]):
        producer.produce(topic, value=value, key=key, partition=index % 2)
    assert producer.flush(60) == 0
    base = load_pipeline(write_pipeline(workdir, name="hostile", topic=topic, bootstrap=kafka_broker.bootstrap_servers,
                                        max_offsets=100))  # fmt: skip
    spec = base.model_copy(update={"transform": base.transform.model_copy(update={"schema_evolution": "add-columns"})})
    pipeline = workdir / "pipeline.toml"
    pipeline.write_text(dump_pipeline(spec))
    result = run_cli("run", str(pipeline), "--available-now")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_every_sink_clean(spark, pipeline, len(records) + 1)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


toml_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=20)
toml_values = st.recursive(
    toml_scalars.filter(lambda v: v is not None),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=5,
)
plausible = {
    "": st.fixed_dictionaries({}, optional={"name": st.text(max_size=8) | toml_values,
                                            "guarantee": st.sampled_from(["exactly-once", "at-least-once", "x"]),
                                            "checkpoint": toml_values}),
    "source": st.fixed_dictionaries({"kind": st.sampled_from(["kafka", "socket", "files", "rate"]) | toml_values},
                                    optional={"topic": st.text(max_size=8) | toml_values,
                                              "max_offsets_per_trigger": toml_values, "kafka.x": toml_values}),
    "transform": st.fixed_dictionaries({"schema": st.sampled_from([SCHEMA, "a INT", "", "a", "a MAP<"]) | toml_values},
                                       optional={"required": toml_values,
                                                 "dedup": st.fixed_dictionaries({}, optional={
                                                     "columns": toml_values, "watermark": toml_values,
                                                     "delay": st.sampled_from(["1 hour", "soon"]) | toml_values}),
                                                 "aggregate": st.dictionaries(st.sampled_from(
                                                     ["window", "by", "sum", "count", "watermark"]), toml_values),
                                                 "schema_evolution": toml_values}),
    "sink": st.fixed_dictionaries({"kind": st.sampled_from(["delta", "postgres", "kafka", "files"]) | toml_values},
                                  optional={"path": st.text(max_size=8) | toml_values, "mode": toml_values,
                                            "key": toml_values, "table": toml_values}),
    "trigger": st.dictionaries(st.sampled_from(["processing_time", "available_now"]), toml_values),
}  # fmt: skip


@st.composite
def pipeline_documents(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    lines = []
    for table, entries in plausible.items():
        if table and draw(st.integers(0, 5)) == 0:
            continue
        if table:
            lines.append(f"[{table}]")
        lines += [f"{json.dumps(key)} = {_toml_value(value)}" for key, value in draw(entries).items()]
    return "\n".join(lines)


@settings(max_examples=300, deadline=None)
@given(document=pipeline_documents())
def test_any_pipeline_file_loads_or_fails_with_one_line(document: str, tmp_path_factory: Any) -> None:
    try:
        parse_pipeline(document, source_name="drawn.toml", base_dir=Path("/tmp"))
    except ConfigError as error:
        message = str(error)
        assert message.startswith("drawn.toml: ") and "\n" not in message and len(message) < 2000, message


def test_the_cli_turns_a_bad_file_into_exit_2_and_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'name = "x"\n[source]\nkind = "kafka"\ntopic = 7\n[transform]\nschema = "a INT"\n[sink]\nkind = "delta"\n'
    )
    result = run_cli("verify", str(bad))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "source.topic" in result.stderr, result.stderr
