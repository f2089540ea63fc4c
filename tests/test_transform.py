"""Classification of records by the transform: every record comes out exactly once, valid or with a reason."""

from __future__ import annotations

from typing import Any

import pytest

from streamproof.config import Transform
from streamproof.generator import order_events
from streamproof.transform.records import parse_records, quarantined_records, valid_records

TRANSFORM = Transform.model_validate(
    {
        "schema": "event_id STRING, order_id STRING, customer_id STRING, amount DOUBLE, status STRING, "
        "event_time TIMESTAMP",
        "required": ["event_id", "order_id"],
    }
)


def _kafka_frame(spark: Any, values: list[bytes | None]) -> Any:
    rows = [("t", 0, offset, None, value) for offset, value in enumerate(values)]
    return spark.createDataFrame(rows, "topic STRING, partition INT, offset LONG, timestamp TIMESTAMP, value BINARY")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'{"event_id":"e","order_id":"o","amount":1.5,"event_time":"2026-01-01T00:00:00.000Z"}', None),
        (b"", "empty"),
        (None, "empty"),
        (b"\xff\xfe\x00garbage", "not_utf8"),
        (b'{"event_id":"e","order_id":"o"', "invalid_json"),
        (b"[1,2]", "invalid_json"),
        (b"42", "invalid_json"),
        (b'{"event_id":"e","order_id":"o","amount":"twelve"}', "schema"),
        (b'{"event_id":"e","order_id":"o","event_time":"yesterday"}', "schema"),
        (b'{"order_id":"o"}', "missing_required:event_id"),
        (b'{"event_id":"  ","order_id":"o"}', "missing_required:event_id"),
        (b'{"event_id":"e","order_id":null}', "missing_required:order_id"),
    ],
)
def test_reason_of_each_kind_of_record(spark: Any, value: bytes | None, reason: str | None) -> None:
    row = parse_records(_kafka_frame(spark, [value]), TRANSFORM).collect()[0]
    assert row["_reject_reason"] == reason


def test_generated_malformed_records_all_land_in_quarantine_and_nothing_else(spark: Any) -> None:
    events = list(order_events(3000, seed=21, malformed=0.1))
    parsed = parse_records(_kafka_frame(spark, [value for _, _, value, _ in events]), TRANSFORM).cache()
    quarantined = {row["_src_offset"] for row in quarantined_records(parsed).collect()}
    valid = {row["_src_offset"] for row in valid_records(parsed).collect()}
    expected_bad = {offset for offset, (_, _, _, kind) in enumerate(events) if kind}
    assert quarantined == expected_bad
    assert valid == set(range(3000)) - expected_bad
    assert valid_records(parsed).columns == [
        "event_id",
        "order_id",
        "customer_id",
        "amount",
        "status",
        "event_time",
        "_src_topic",
        "_src_partition",
        "_src_offset",
        "_src_timestamp",
    ]
    parsed.unpersist()


def test_add_columns_carries_undeclared_fields_as_text_columns(spark: Any) -> None:
    from streamproof.transform.records import with_extra_columns

    evolving = TRANSFORM.model_copy(update={"schema_evolution": "add-columns"})
    values = [
        b'{"event_id":"a","order_id":"o"}',
        b'{"event_id":"b","order_id":"o","channel":"web","Amount":3,"bad key":1,"meta":{"x":[1,2]}}',
        b'{"event_id":"c","order_id":"o","channel":"app","coupon":null}',
        b'{"event_id":"d","order_id":"o","amount":{"value":1}}',  # a type change: quarantined, not carried
    ]
    parsed = parse_records(_kafka_frame(spark, values), evolving)
    rows = with_extra_columns(valid_records(parsed))
    # "Amount" is the declared amount in another case, "bad key" no column name: neither becomes a column.
    assert rows.columns[-3:] == ["channel", "coupon", "meta"]
    by_id = {row["event_id"]: row for row in rows.collect()}
    assert sorted(by_id) == ["a", "b", "c"]
    assert (by_id["a"]["channel"], by_id["b"]["channel"], by_id["c"]["channel"]) == (None, "web", "app")
    assert by_id["b"]["meta"] == '{"x":[1,2]}' and by_id["c"]["coupon"] is None
    assert [row["reason"] for row in quarantined_records(parsed).collect()] == ["schema"]
    # Without schema evolution the same records keep the declared columns only.
    assert with_extra_columns(valid_records(parse_records(_kafka_frame(spark, values), TRANSFORM))).columns[-1] == (
        "_src_timestamp"
    )


def test_derived_columns_are_analysed_before_start_and_computed_per_row(spark: Any) -> None:
    from streamproof.errors import ConfigError
    from streamproof.transform.records import check_derived_columns, with_derived_columns

    derived = TRANSFORM.model_copy(update={"columns": {"amount_cents": "cast(amount * 100 as bigint)",
                                                       "ingested_at": "_src_timestamp"}})  # fmt: skip
    check_derived_columns(spark, derived, exactly_once=True)
    value = b'{"event_id":"e","order_id":"o","amount":12.34}'
    rows = with_derived_columns(valid_records(parse_records(_kafka_frame(spark, [value]), derived)), derived)
    assert rows.columns[-2:] == ["amount_cents", "ingested_at"]
    assert rows.collect()[0]["amount_cents"] == 1234
    # rand() passes the name check only if hidden in a UDF; Catalyst's analysis still sees it is nondeterministic.
    random = TRANSFORM.model_copy(update={"columns": {"noise": "amount + rand()"}})
    with pytest.raises(ConfigError, match=r"transform.columns.noise: 'amount \+ rand\(\)' is nondeterministic"):
        check_derived_columns(spark, random, exactly_once=True)
    check_derived_columns(spark, random, exactly_once=False)
    unknown = TRANSFORM.model_copy(update={"columns": {"x": "no_such_column + 1"}})
    with pytest.raises(ConfigError, match=r"transform.columns.x: 'no_such_column \+ 1' cannot be evaluated") as raised:
        check_derived_columns(spark, unknown, exactly_once=False)
    assert "\n" not in str(raised.value)


def test_a_batch_s_counts_and_rejected_records_from_its_cache_are_those_of_a_query_over_it(
    spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``BatchWriter._count`` reads a cached batch's counts from the statistics Spark's cache keeps, and gathers its
    rejected records in the same job (``dev.streamproof.cache.CachedCounts``); the grouped query over the batch,
    which a watermark still uses, and the quarantine's filter over the cache are the reference. Several cached
    batches of rows a partition (10,000 rows each), a partition without a record time."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from streamproof.pipeline import batches
    from streamproof.pipeline.batches import BatchWriter

    ids = spark.range(0, 40_000, numPartitions=3)  # the last partition holds ids 26,667 and up
    rejected = F.col("id") % 997 == 0
    batch = ids.select(
        F.lit("orders").alias("_src_topic"),
        (F.col("id") % 4).cast("int").alias("_src_partition"),
        F.col("id").alias("_src_offset"),
        # The oldest time in a later cached batch of a later partition: id 25,999, in the second partition's second.
        F.when(
            F.col("id") < 26_000, F.timestamp_micros(F.lit(1_700_000_000_123_456) + (30_000 - F.col("id")) * 1_001)
        ).alias("_src_timestamp"),
        F.when(rejected, F.lit("invalid_json")).alias("_reject_reason"),
        F.when(rejected, F.concat(F.lit("{"), F.col("id").cast("string")).cast("binary")).alias("_raw_value"),
    )

    def without_rows(counts: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in counts.items() if key != "rejected_rows"}

    cached = batch.persist(StorageLevel.MEMORY_AND_DISK_DESER)
    try:
        from_statistics = BatchWriter._count(cached, None)
        grouped = BatchWriter._count(cached, F.lit(False))
        assert without_rows(from_statistics) == grouped
        assert from_statistics["records"] == 40_000 and from_statistics["invalid"] == len(range(0, 40_000, 997))
        assert from_statistics["oldest_produced_ms"] == (1_700_000_000_123_456 + 4_001 * 1_001) // 1000
        gathered = quarantined_records(from_statistics["rejected_rows"]).collect()
        assert sorted(gathered) == sorted(quarantined_records(cached).collect())
        assert len(gathered) == from_statistics["invalid"]
        # The partitions hold 14, 13 and 14 rejected records. Each may give its share of the bound (a third): at 14
        # all are gathered; at 13 two partitions are over it, and none is (the quarantine's write reads the cache).
        monkeypatch.setattr(batches, "QUARANTINE_ONE_FILE_ROWS", 42)
        assert len(quarantined_records(BatchWriter._count(cached, None)["rejected_rows"]).collect()) == 41
        monkeypatch.setattr(batches, "QUARANTINE_ONE_FILE_ROWS", 39)
        assert BatchWriter._count(cached, None)["rejected_rows"] is None
        monkeypatch.setattr(batches, "QUARANTINE_ONE_FILE_ROWS", 100_000)
        monkeypatch.setattr(batches, "QUARANTINE_GATHERED_BYTES", 300)  # bytes: a partition's 14 records are more
        assert BatchWriter._count(cached, None)["rejected_rows"] is None
    finally:
        cached.unpersist()
    untimed = batch.where(F.col("_src_offset") >= 26_000).persist(StorageLevel.MEMORY_AND_DISK_DESER)
    try:
        assert without_rows(BatchWriter._count(untimed, None)) == BatchWriter._count(untimed, F.lit(False))
        assert BatchWriter._count(untimed, None)["oldest_produced_ms"] is None
    finally:
        untimed.unpersist()
    # Not cached: counted by the grouped query.
    assert BatchWriter._count(batch, None) == grouped
