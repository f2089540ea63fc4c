"""Deterministic load generator: JSON order events, with chosen shares of malformed, duplicate and late records.

The same ``(seed, count, partitions, malformed, duplicates, late)`` always produces the same bytes in the same
partitions:
record ``i`` is built from a random stream seeded by ``seed`` alone, and its partition is a hash of its
key, so a failure seen once can be replayed. Every valid event has a unique ``event_id``; ``order_id``
repeats (an order goes through several statuses). Malformed records come in five kinds, each invalid
for a reason the transform must detect (:mod:`streamproof.transform.records`):

* ``broken_json``: a valid event cut short;
* ``missing_required``: ``event_id`` or ``order_id`` removed;
* ``wrong_type``: ``amount`` as a word, or ``event_time`` as ``"yesterday"``;
* ``empty_value``: a zero-length message, or an ``event_id`` of ``""``;
* ``binary_garbage``: bytes that are not UTF-8.

Upstream trouble that is not malformed:

* ``duplicate`` (``--duplicates F``): a resend of an earlier valid event, byte for byte (same ``event_id`` and
  event time), as a producer retry would; mostly one of the last few thousand events, one in four
  from much further back, and three in ten into another partition than the original;
* ``late`` (``--late F``): a new event whose event time is :data:`LATE_BY` behind the stream's;
* a schema change (``--schema-change-at N``): from record ``N`` on, events carry a new optional field
  ``channel``, and one in :data:`TYPE_CHANGE_ONE_IN` sends ``amount`` as an object (``{"value": .., "currency":
  ..}``), a type change the declared schema cannot read: kind ``type_change``, counted as malformed.

``count`` is the number of records produced, duplicates included.

The producer is idempotent with ``acks=all``: a retried send is not duplicated by the broker.

Example::

    >>> result = generate("127.0.0.1:9092", "orders", count=1000, malformed=0.01, seed=7)  # doctest: +SKIP
    >>> result.malformed                                                                    # doctest: +SKIP
    9
"""

from __future__ import annotations

import functools
import io
import json
import random
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict, Unpack

from confluent_kafka import KafkaException, Producer

from streamproof.errors import ConfigError, InfraError
from streamproof.kafka_client import client_config, ensure_topic, topic_end_offsets
from streamproof.transform.avro import AvroContract

MALFORMED_KINDS = ("broken_json", "missing_required", "wrong_type", "empty_value", "binary_garbage")
STATUSES = ("created", "paid", "shipped", "delivered", "cancelled")
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
EVENT_SPACING_MS = 10  # event time advances 10 ms per event: 1M events span under 3 hours
LATE_BY = timedelta(hours=6)  # a late event's time is this far behind: older than any sensible watermark delay
RECENT_EVENTS = 2_000  # a resend mostly repeats one of the last this many events
OLD_EVENTS_KEPT = 10_000  # and otherwise one drawn from a sample of this many older ones
TYPE_CHANGE = "type_change"
TYPE_CHANGE_ONE_IN = 20
CHANNELS = ("web", "app", "store")


@dataclass
class GenerationResult:
    topic: str
    count: int
    partitions: int
    seed: int
    malformed: int = 0
    malformed_by_kind: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    late: int = 0
    seconds: float = 0.0
    end_offsets: dict[int, int] = field(default_factory=dict)

    @property
    def valid(self) -> int:
        return self.count - self.malformed

    @property
    def records_per_second(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


@functools.lru_cache(maxsize=4096)
def _second_text(second: int) -> str:
    return (EPOCH + timedelta(seconds=second)).strftime("%Y-%m-%dT%H:%M:%S")


def event_time_text(index: int, jitter_ms: int, behind_ms: int = 0) -> str:
    """ISO-8601 UTC event time of event ``index``, ``behind_ms`` earlier for a late event.

    >>> event_time_text(0, 5)
    '2026-01-01T00:00:00.005Z'
    >>> event_time_text(0, 5, behind_ms=3_600_000)
    '2025-12-31T23:00:00.005Z'
    """
    millis = index * EVENT_SPACING_MS + jitter_ms - behind_ms
    return f"{_second_text(millis // 1000)}.{millis % 1000:03d}Z"


class EventMix(TypedDict, total=False):
    """What the generated events hold besides valid orders (each a keyword of :func:`order_events`, :func:`generate`):
    ``seed`` (default 42), shares of ``malformed``, ``duplicates`` and ``late`` events, and ``schema_change_at``."""

    seed: int
    malformed: float
    duplicates: float
    late: float
    schema_change_at: int | None


def order_events(
    count: int, *, partitions: int = 4, start_index: int = 0, avro: AvroContract | None = None, **mix: Unpack[EventMix]
) -> Iterator[tuple[int, bytes | None, bytes, str | None]]:
    """Yield ``(partition, key, value, kind)`` for records ``start_index .. start_index+count-1``; ``kind`` is
    None for a plain valid event, a malformed kind, ``"duplicate"`` or ``"late"``. With ``avro``, the same events
    as Avro records of that writer schema (:class:`AvroEncoder`).

    >>> first = next(order_events(1, seed=1))
    >>> json.loads(first[2])["event_id"]
    'ev-1-0000000000'
    """
    seed, malformed = mix.get("seed", 42), mix.get("malformed", 0.0)
    duplicates, late, schema_change_at = mix.get("duplicates", 0.0), mix.get("late", 0.0), mix.get("schema_change_at")
    for option, fraction in (("--malformed", malformed), ("--duplicates", duplicates), ("--late", late)):
        if not 0.0 <= fraction <= 1.0:
            raise ConfigError(f"{option} {fraction}: must be a fraction between 0 and 1")
    if avro is not None and schema_change_at is not None:
        raise ConfigError("--schema-change-at: JSON records only (an Avro record's fields are those of its schema)")
    encode = AvroEncoder(avro, seed) if avro is not None else None
    rng = random.Random(seed)
    # Duplicates and lateness draw from streams of their own: the events themselves stay those of the seed.
    upstream = random.Random(f"{seed}:upstream")
    recent: deque[tuple[int, bytes, bytes]] = deque(maxlen=RECENT_EVENTS)
    older: list[tuple[int, bytes, bytes]] = []
    older_seen = 0
    behind_ms = int(LATE_BY.total_seconds() * 1000)
    orders = max(1, (start_index + count) // 3)
    customers = max(1, min(10_000, orders))
    for index in range(start_index, start_index + count):
        if duplicates and recent and upstream.random() < duplicates:
            pool = older if older and upstream.random() < 0.25 else recent
            partition, key, value = pool[upstream.randrange(len(pool))]
            if partitions > 1 and upstream.random() < 0.3:
                partition = (partition + 1 + upstream.randrange(partitions - 1)) % partitions
            yield partition, key, value, "duplicate"
            continue
        is_late = bool(late) and upstream.random() < late
        order_id = f"ord-{seed}-{rng.randrange(orders):08d}"
        event = (
            f'{{"event_id":"ev-{seed}-{index:010d}","order_id":"{order_id}",'
            f'"customer_id":"cust-{rng.randrange(customers):05d}","amount":{rng.randrange(100, 50_000) / 100},'
            f'"status":"{STATUSES[rng.randrange(len(STATUSES))]}",'
            f'"event_time":"{event_time_text(index, rng.randrange(10), behind_ms if is_late else 0)}"}}'
        )
        key = order_id.encode()
        partition = zlib.crc32(key) % partitions
        kind = "late" if is_late else None
        record: str | bytes = event
        if malformed and rng.random() < malformed:
            kind = MALFORMED_KINDS[rng.randrange(len(MALFORMED_KINDS))]
            record = _spoil(event, kind, rng)
        elif schema_change_at is not None and index >= schema_change_at:  # a record is invalid for one reason
            record, changed = _changed_schema(event, upstream)
            kind = TYPE_CHANGE if changed else kind
        if encode is not None:
            value = encode(event, record, kind, index)
        else:
            value = record.encode() if isinstance(record, str) else record
        if duplicates and kind not in (*MALFORMED_KINDS, TYPE_CHANGE):  # only valid events are resent
            if len(recent) == recent.maxlen:  # the oldest recent event joins the sample of older ones
                older_seen += 1
                evicted = recent[0]
                if len(older) < OLD_EVENTS_KEPT:
                    older.append(evicted)
                elif (slot := upstream.randrange(older_seen)) < OLD_EVENTS_KEPT:
                    older[slot] = evicted
            recent.append((partition, key, value))
        yield partition, key, value, kind


# The Avro writer schema of the generated events (examples/schemas/order.avsc holds the same; a test keeps them equal).
ORDER_AVRO_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "OrderEvent",
        "namespace": "streamproof.examples",
        "doc": "One event of an order, as `streamproof generate --format avro` writes it.",
        "fields": [
            *(
                {"name": name, "type": ["null", "string"], "default": None}
                for name in ("event_id", "order_id", "customer_id")
            ),
            {"name": "amount", "type": ["null", "double"], "default": None},
            {"name": "status", "type": ["null", "string"], "default": None},
            {
                "name": "event_time",
                "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
                "default": None,
            },
        ],
    }
)


class AvroEncoder:
    """The generated events as Avro records of a writer schema (with Confluent's header when from a registry).

    The malformed kinds become what an Avro reader must refuse or quarantine: ``broken_json`` and ``wrong_type``
    a datum cut short (no Avro reader can finish it), ``missing_required`` and ``empty_value`` a record whose field
    is null or blank, ``binary_garbage`` bytes of no schema (and no header).

    >>> contract = AvroContract(ORDER_AVRO_SCHEMA, schema_id=3)
    >>> _, _, value, _ = next(order_events(1, seed=1, avro=contract))
    >>> value.startswith(contract.header()), len(value)
    (True, 75)
    """

    def __init__(self, contract: AvroContract, seed: int) -> None:
        import fastavro  # only for Avro data

        self.contract, self.seed = contract, seed
        self.names = contract.field_names()  # parsed once: datum() runs for every generated record
        self.schema = fastavro.parse_schema(json.loads(contract.schema_json))
        self.write = fastavro.schemaless_writer

    def datum(self, record: dict[str, Any]) -> bytes:
        fields = {name: record.get(name) for name in self.names}
        if isinstance(when := fields.get("event_time"), str):
            fields["event_time"] = datetime.fromisoformat(when.replace("Z", "+00:00"))
        out = io.BytesIO()
        self.write(out, self.schema, fields)
        return out.getvalue()

    def __call__(self, event: str, record: str | bytes, kind: str | None, index: int) -> bytes:
        if isinstance(record, bytes):  # binary_garbage: no header, no datum
            return record
        if kind in ("broken_json", "wrong_type"):
            whole = self.datum(json.loads(event))
            cut = random.Random(f"{self.seed}:avro:{index}").randrange(1, len(whole))
            return self.contract.frame(whole[:cut])
        if record == "":
            return b""
        return self.contract.frame(self.datum(json.loads(record)))


def _changed_schema(event: str, rng: random.Random) -> tuple[str, bool]:
    """The event after the upstream schema change: a new field ``channel``; sometimes ``amount`` as an object."""
    record = json.loads(event)
    record["channel"] = CHANNELS[rng.randrange(len(CHANNELS))]
    changed = rng.randrange(TYPE_CHANGE_ONE_IN) == 0
    if changed:
        record["amount"] = {"value": record["amount"], "currency": "EUR"}
    return json.dumps(record, separators=(",", ":")), changed


def _spoil(event: str, kind: str, rng: random.Random) -> str | bytes:
    if kind == "broken_json":
        return event[: rng.randrange(1, len(event) - 1)]
    if kind == "missing_required":
        record = json.loads(event)
        del record[rng.choice(("event_id", "order_id"))]
        return json.dumps(record, separators=(",", ":"))
    if kind == "wrong_type":
        record = json.loads(event)
        if rng.random() < 0.5:
            record["amount"] = "twelve euros"
        else:
            record["event_time"] = "yesterday"
        return json.dumps(record, separators=(",", ":"))
    if kind == "empty_value":
        if rng.random() < 0.5:
            return ""
        record = json.loads(event)
        record["event_id"] = ""
        return json.dumps(record, separators=(",", ":"))
    # binary_garbage: 0xFF never occurs in UTF-8, so the value can never decode as text.
    return b"\xff\xfe" + rng.randbytes(rng.randrange(4, 64))


def generate(
    bootstrap_servers: str,
    topic: str,
    count: int,
    *,
    partitions: int = 4,
    manifest_dir: Path | None = None,
    on_progress: Callable[[int], None] | None = None,
    avro: AvroContract | None = None,
    **mix: Unpack[EventMix],
) -> GenerationResult:
    """Produce ``count`` events into ``topic`` (created if missing) and wait until all are acknowledged; with
    ``avro``, as Avro records of that writer schema.

    With ``manifest_dir``, the run is appended to ``<manifest_dir>/<topic>.json`` so verification can
    compare its counts with what the generator knowingly produced.
    """
    if count < 0:
        raise ConfigError(f"--count {count}: must be zero or more")
    if partitions < 1:
        raise ConfigError(f"--partitions {partitions}: must be at least 1")
    actual_partitions = ensure_topic(bootstrap_servers, topic, partitions)
    if actual_partitions != partitions:
        raise ConfigError(
            f"topic {topic!r} already exists with {actual_partitions} partitions, not {partitions}: "
            f"pass --partitions {actual_partitions} or use another topic"
        )
    failures: list[str] = []

    def on_delivery(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(
        client_config(
            bootstrap_servers,
            **{
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 20,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 500_000,
                "delivery.report.only.error": True,
            },
        )
    )
    result = GenerationResult(topic, count, partitions, mix.get("seed", 42))
    kinds: Counter[str] = Counter()
    started = time.monotonic()
    previous = _manifest_records(manifest_dir, topic)
    events = order_events(count, partitions=partitions, start_index=previous, avro=avro, **mix)
    for sent, (partition, key, value, kind) in enumerate(events):
        if kind:
            kinds[kind] += 1
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if sent % 10_000 == 0:
            producer.poll(0)
            if on_progress:
                on_progress(sent)
    remaining = producer.flush(120)
    if remaining:
        raise InfraError(f"{remaining} records were not acknowledged by {bootstrap_servers} within 120 s")
    if failures:
        raise InfraError(f"{len(failures)} records failed to be produced, first error: {failures[0]}")
    result.seconds = time.monotonic() - started
    result.duplicates, result.late = kinds.pop("duplicate", 0), kinds.pop("late", 0)
    result.malformed = sum(kinds.values())
    result.malformed_by_kind = dict(sorted(kinds.items()))
    try:
        result.end_offsets = topic_end_offsets(bootstrap_servers, topic)
    except KafkaException:
        result.end_offsets = {}
    if on_progress:
        on_progress(count)
    if manifest_dir is not None:
        _append_manifest(manifest_dir, result)
    return result


def _manifest_path(manifest_dir: Path, topic: str) -> Path:
    return manifest_dir / f"{topic}.json"


def _manifest_records(manifest_dir: Path | None, topic: str) -> int:
    # Event indexes continue across runs into one topic, so event ids stay unique.
    return 0 if manifest_dir is None else int(load_manifest(manifest_dir, topic).get("records", 0))


def load_manifest(manifest_dir: Path, topic: str) -> dict[str, Any]:
    """What the generator produced into ``topic`` so far: records, malformed, by kind, runs."""
    path = _manifest_path(manifest_dir, topic)
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def _append_manifest(manifest_dir: Path, result: GenerationResult) -> None:
    manifest_dir.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(manifest_dir, result.topic) or {
        "topic": result.topic,
        "records": 0,
        "malformed": 0,
        "malformed_by_kind": {},
        "runs": [],
    }
    manifest["records"] = int(manifest["records"]) + result.count
    manifest["malformed"] = int(manifest["malformed"]) + result.malformed
    for upstream_kind in ("duplicates", "late"):
        manifest[upstream_kind] = int(manifest.get(upstream_kind, 0)) + getattr(result, upstream_kind)
    by_kind = Counter(manifest["malformed_by_kind"])
    by_kind.update(result.malformed_by_kind)
    manifest["malformed_by_kind"] = dict(sorted(by_kind.items()))
    manifest["end_offsets"] = {str(p): o for p, o in result.end_offsets.items()}
    manifest["runs"].append({k: v for k, v in asdict(result).items() if k != "end_offsets"})
    _manifest_path(manifest_dir, result.topic).write_text(json.dumps(manifest, indent=2))
