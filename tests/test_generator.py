"""The load generator is deterministic and its malformed records are exactly the ones it says; a broker that does not
answer is one line."""

from __future__ import annotations

import json
import socket
from collections import Counter

from conftest import run_cli
from streamproof.generator import MALFORMED_KINDS, event_time_text, order_events


def _is_valid_event(value: bytes) -> bool:
    # The same rule as the pipeline's transform, in plain Python: UTF-8 JSON object, typed fields,
    # required ids present and non-blank.
    try:
        record = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(record, dict):
        return False
    if not all(isinstance(record.get(k), str) and record[k].strip() for k in ("event_id", "order_id")):
        return False
    if not isinstance(record.get("amount"), int | float):
        return False
    return isinstance(record.get("event_time"), str) and record["event_time"].endswith("Z")


def test_same_seed_gives_the_same_records_in_the_same_partitions() -> None:
    first = list(order_events(2000, seed=11, malformed=0.05, partitions=4))
    again = list(order_events(2000, seed=11, malformed=0.05, partitions=4))
    other = list(order_events(2000, seed=12, malformed=0.05, partitions=4))
    assert first == again
    assert first != other


def test_every_valid_event_has_a_unique_event_id_and_all_fields() -> None:
    events = [json.loads(v) for _, _, v, kind in order_events(5000, seed=3) if kind is None]
    assert len(events) == 5000
    assert len({e["event_id"] for e in events}) == 5000
    assert set(events[0]) == {"event_id", "order_id", "customer_id", "amount", "status", "event_time"}
    assert len({e["order_id"] for e in events}) < 5000  # orders repeat: several statuses per order


def test_malformed_records_are_invalid_and_valid_ones_are_valid() -> None:
    kinds: Counter[str] = Counter()
    for _, _, value, kind in order_events(20_000, seed=5, malformed=0.05):
        assert _is_valid_event(value) == (kind is None), (kind, value[:80])
        if kind:
            kinds[kind] += 1
    assert set(kinds) == set(MALFORMED_KINDS)
    assert 800 < sum(kinds.values()) < 1200  # 5% of 20,000, seeded


def test_partition_follows_the_key_so_an_order_stays_in_one_partition() -> None:
    partitions: dict[bytes, set[int]] = {}
    for partition, key, _, _ in order_events(5000, seed=9, partitions=3):
        partitions.setdefault(key, set()).add(partition)
    assert all(len(p) == 1 for p in partitions.values())
    assert {p for ps in partitions.values() for p in ps} == {0, 1, 2}


def test_event_time_is_iso_utc_with_milliseconds() -> None:
    assert event_time_text(0, 0) == "2026-01-01T00:00:00.000Z"
    assert event_time_text(100_000, 7) == "2026-01-01T00:16:40.007Z"


def test_duplicates_resend_earlier_valid_events_some_into_another_partition() -> None:
    events = list(order_events(20_000, seed=4, malformed=0.01, duplicates=0.05, partitions=4))
    first_seen: dict[bytes, int] = {}
    moved = resends = 0
    for partition, _, value, kind in events:
        if kind == "duplicate":
            resends += 1
            assert value in first_seen, "a resend repeats an event sent before"
            moved += first_seen[value] != partition
        elif kind is None or kind == "late":
            first_seen.setdefault(value, partition)
    assert 800 < resends < 1200  # 5% of 20,000
    assert 0.2 < moved / resends < 0.4  # three in ten go to another partition
    assert events == list(order_events(20_000, seed=4, malformed=0.01, duplicates=0.05, partitions=4))


def test_late_events_are_six_hours_behind_and_the_schema_change_adds_a_field() -> None:
    from datetime import datetime

    events = list(order_events(5_000, seed=6, late=0.02, schema_change_at=2_500))
    for index, (_, _, value, kind) in enumerate(events):
        record = json.loads(value)
        if kind == "type_change":
            assert index >= 2_500 and isinstance(record["amount"], dict)
            continue
        event_time = datetime.fromisoformat(record["event_time"])
        on_time = datetime.fromisoformat(event_time_text(index, 0))
        behind = (on_time - event_time).total_seconds()
        assert (5.9 * 3600 < behind < 6.1 * 3600) if kind == "late" else -1 < behind <= 0.01
        assert ("channel" in record) == (index >= 2_500)
    kinds = [kind for *_, kind in events]
    assert 60 < kinds.count("late") < 140 and 80 < kinds.count("type_change") < 170


def test_a_broker_that_does_not_answer_is_one_line_not_librdkafka_s_retries() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = run_cli("generate", "--topic", "t", "--count", "10", "--bootstrap-servers", f"127.0.0.1:{port}", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: cannot reach Kafka at 127.0.0.1:{port}: start it with `streamproof infra up`"
    ], done.stderr[-2000:]
