"""The events a run publishes: the line people read, the JSON line programs read, and the Kafka lag."""

from __future__ import annotations

import pytest

from streamproof.pipeline.events import BatchCommitted, Notice, decode, encode, kafka_lag


def test_lag_sums_latest_minus_end_over_partitions() -> None:
    progress = {"endOffset": {"t": {"0": 5, "1": 7}}, "latestOffset": '{"t": {"0": 9, "1": 10}}'}
    assert kafka_lag(progress) == 7


def test_lag_is_unknown_without_offsets() -> None:
    assert kafka_lag({"endOffset": None, "latestOffset": None}) is None


@pytest.mark.parametrize(
    "event",
    [
        BatchCommitted(
            "orders",
            12,
            rows_in=100_000,
            rows_out=99_900,
            quarantined=100,
            duration_s=1.96,
            lag=2500,
            sink_seconds={"delta": 1.2, "pg": 0.7},
            replay_skipped=True,
        ),  # fmt: skip
        BatchCommitted(
            "orders",
            3,
            rows_in=10,
            rows_out=8,
            quarantined=2,
            duration_s=0.0,
            lag=None,
            duplicates_dropped=1,
            late=1,
            late_handling="quarantined",
            remark="r",
        ),  # fmt: skip
        Notice("orders", "ready", "starting Spark (checkpoint and sinks checked)"),
    ],
)
def test_an_event_reads_back_from_its_json_line_unchanged(event: BatchCommitted | Notice) -> None:
    assert decode(encode(event)) == event


def test_the_batch_line_says_every_figure_of_the_event() -> None:
    event = BatchCommitted("orders", 12, rows_in=100_000, rows_out=99_900, quarantined=100, duration_s=1.96, lag=2500,
                           sink_seconds={"delta": 1.2, "pg": 0.7}, duplicates_dropped=4, late=3,
                           late_handling="dropped", replay_skipped=True)  # fmt: skip
    assert event.line() == (
        "[orders] batch 12 committed: 100000 rows in, 99900 to sink, 100 quarantined, 51,020 rows/s, 2.0 s, "
        "kafka lag 2500; delta 1.2 s, pg 0.7 s; 4 duplicates dropped, 3 late (dropped) "
        "(replayed batch: the sink already held it and skipped the write)"
    )
