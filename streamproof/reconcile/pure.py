"""The independent checker's judgement: plain Python over small tables, no Spark, no JVM.

The same rules as the Spark checker (:mod:`streamproof.reconcile.checker`, DESIGN.md), written again from the
rules and not from its code, over the rows the independent readers return (:mod:`streamproof.reconcile.independent`):
each source record (coordinates, valid or not, dropped by configuration or not, its parsed values), the sink's
rows and the quarantine table's coordinates. Both answer in :class:`~streamproof.reconcile.counts.Counts`, term by
term, and must agree. Every function here is a function of its arguments, unit-tested without a JVM on planted
loss, duplicates, unexpected rows, wrong sums and wrong late flags (tests/test_pure_checker.py).

Example::

    >>> source = [SourceRecord(("t", 0, 0), True, values={}), SourceRecord(("t", 0, 1), False, values={})]
    >>> counts = check_records(source, sink=[("t", 0, 0), ("t", 0, 0)], quarantine=[("t", 0, 1)])
    >>> counts.expected, counts.quarantined, counts.lost, counts.duplicated, counts.unexpected
    (1, 1, 0, 1, 0)
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from streamproof.reconcile.counts import SAMPLES, Counts

Coordinates = tuple[str, int, int]
EXACT = Decimal("1e-10")  # the scale of DECIMAL(38, 10), the exact sums both sides are compared in


@dataclass(slots=True)
class SourceRecord:
    """One source record as the independent reader parsed it."""

    at: Coordinates
    valid: bool
    dropped: bool = False  # expected nowhere (late, with dedup.late = "drop")
    # With dedup.late = "drop": in a batch the offset log no longer holds, older than the watermark of its first
    # entry, so whether it was late cannot be recomputed (each sink's rows judge it: independent.maybe_late_resolved).
    maybe_late: bool = False
    values: dict[str, Any] = field(default_factory=dict)


def exact(value: Any) -> Decimal | None:
    """A value as the exact decimal both checkers sum in (a float by its shortest text, as Java prints it).

    >>> exact(0.1), exact(None), exact(3)
    (Decimal('0.1000000000'), None, Decimal('3.0000000000'))
    """
    if value is None:
        return None
    number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    return number.quantize(EXACT, rounding=ROUND_HALF_UP)


def _text(value: Decimal | None) -> str | None:
    """An exact sum as the report names it: text (JSON keeps it exact), a null as null."""
    return None if value is None else str(value)


def _sample(kind_rows: dict[str, list[dict[str, Any]]], kind: str, row: dict[str, Any]) -> None:
    rows = kind_rows.setdefault(kind, [])
    if len(rows) < SAMPLES:
        rows.append(row)


def _pick(found: list[tuple[str, Any, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The first :data:`SAMPLES` of each kind of damage in a stable order (by the damaged identity), without
    sorting everything that was checked."""
    kinds: dict[str, list[tuple[Any, dict[str, Any]]]] = defaultdict(list)
    for kind, key, row in found:
        kinds[kind].append((key, row))
    return {
        kind: [row for _, row in heapq.nsmallest(SAMPLES, rows, key=lambda item: repr(item[0]))]
        for kind, rows in kinds.items()
    }


def _named(at: Coordinates) -> dict[str, Any]:
    return {"_src_topic": at[0], "_src_partition": at[1], "_src_offset": at[2]}


def _quarantine_side(source: Sequence[SourceRecord], quarantine: Iterable[Coordinates]) -> dict[str, Any]:
    """Invalid records against the quarantine table, by coordinates; each record counted once however often read."""
    reads = Counter(record.at for record in source)
    valid = {record.at for record in source if record.valid}
    dropped = {record.at for record in source if record.dropped}
    held = Counter(quarantine)
    belongs = set(reads) - valid - dropped
    samples: dict[str, list[dict[str, Any]]] = {}
    counted = {"lost": 0, "duplicated": 0, "unexpected": 0, "quarantined": 0}
    for at in sorted(belongs):
        if at not in held:
            counted["lost"] += 1
            _sample(samples, "lost", {**_named(at), "in": "quarantine"})
        else:
            counted["quarantined"] += 1
            if held[at] > 1:
                counted["duplicated"] += held[at] - 1
                _sample(samples, "duplicated", {**_named(at), "in": "quarantine", "rows": held[at]})
    for at in sorted(set(held) - belongs):
        counted["unexpected"] += held[at]
        _sample(samples, "unexpected", {**_named(at), "in": "quarantine", "rows": held[at], "valid": at in valid})
    return {**counted, "source_records": sum(reads.values()), "dropped": len(dropped), "samples": samples}


def _after_first(source: Sequence[SourceRecord], group: Any, newest_first: bool = False, order: Any = None) -> int:
    """Distinct coordinates of valid records that are not the first of their group (by coordinates, or by ``order``
    descending when ``newest_first``): upstream duplicates, superseded records; never a remainder of other terms."""
    first: dict[Any, tuple[Any, Coordinates]] = {}
    for record in source:
        if not record.valid:
            continue
        rank = order(record) if order is not None else record.at
        key = group(record)
        best = first.get(key)
        if best is None or (rank > best[0] if newest_first else rank < best[0]):
            first[key] = (rank, record.at)
    firsts = {at for _, at in first.values()}
    return len({record.at for record in source if record.valid and record.at not in firsts})


def _counts(side: dict[str, Any], sink: dict[str, Any], **terms: int) -> Counts:
    named = {**side["samples"], **sink["samples"]}
    samples = {kind: (side["samples"].get(kind, []) + sink["samples"].get(kind, []))[:SAMPLES] for kind in named}
    return Counts(
        source_records=side["source_records"],
        expected=sink["expected"],
        quarantined=side["quarantined"],
        upstream_duplicates=terms.get("upstream_duplicates", 0),
        sink_records=sink["sink_records"],
        lost=sink["lost"] + side["lost"],
        duplicated=sink["duplicated"] + side["duplicated"],
        unexpected=sink["unexpected"] + side["unexpected"],
        superseded=terms.get("superseded", 0),
        dropped_late=side["dropped"],
        aggregated=terms.get("aggregated", 0),
        pending=terms.get("pending", 0),
        quarantine_lost=side["lost"],
        wrong_values=sink.get("wrong_values", 0),
        samples=samples,
    )


def check_records(
    source: Sequence[SourceRecord],
    sink: Iterable[tuple[Any, ...]],
    quarantine: Iterable[Coordinates],
    key_columns: list[str] | None = None,
) -> Counts:
    """One sink row per valid record, matched on coordinates (``sink`` holds each row's coordinates), or, with
    ``key_columns``, one per dedup key (``sink`` holds each row's key values, in that order).

    >>> resent = [SourceRecord(("t", 0, i), True, values={"id": "e1"}) for i in (0, 1)]
    >>> counts = check_records(resent, [("e1",)], [], key_columns=["id"])
    >>> counts.expected, counts.upstream_duplicates, counts.lost
    (1, 1, 0)
    """

    def identity(record: SourceRecord) -> tuple[Any, ...]:
        return tuple(record.values.get(c) for c in key_columns) if key_columns else record.at

    expected = {identity(record) for record in source if record.valid}
    held = Counter(tuple(row) for row in sink)
    counted: dict[str, Any] = {
        "expected": len(expected),
        "lost": 0,
        "duplicated": 0,
        "unexpected": 0,
        "sink_records": sum(held.values()),
        "samples": {},
    }
    names = list(key_columns) if key_columns else ["_src_topic", "_src_partition", "_src_offset"]
    found = []
    for ident in expected:
        if ident not in held:
            counted["lost"] += 1
            found.append(("lost", ident, dict(zip(names, ident, strict=True))))
        elif held[ident] > 1:
            counted["duplicated"] += held[ident] - 1
            found.append(("duplicated", ident, {**dict(zip(names, ident, strict=True)), "rows": held[ident]}))
    for ident in held.keys() - expected:
        counted["unexpected"] += held[ident]
        found.append(("unexpected", ident, {**dict(zip(names, ident, strict=True)), "rows": held[ident]}))
    counted["samples"] = _pick(found)
    upstream = _after_first(source, lambda r: tuple(r.values.get(c) for c in key_columns)) if key_columns else 0
    return _counts(_quarantine_side(source, quarantine), counted, upstream_duplicates=upstream)


def _newest(order_by: str) -> Any:
    """The latest record of a key: the greatest ``order_by`` (a null is the oldest), then the greatest coordinates."""
    return lambda record: (record.values.get(order_by) is not None, record.values.get(order_by) or 0, record.at)


def check_latest(
    source: Sequence[SourceRecord],
    sink: Iterable[tuple[Any, Coordinates]],
    quarantine: Iterable[Coordinates],
    key: str,
    order_by: str,
) -> Counts:
    """One row per ``key`` holding its latest valid record; ``sink`` holds each row's (key, coordinates).

    >>> old, new = (SourceRecord(("t", 0, i), True, values={"k": "a", "at": i}) for i in (0, 1))
    >>> counts = check_latest([old, new], [("a", ("t", 0, 0))], [], "k", "at")
    >>> counts.expected, counts.superseded, counts.lost
    (1, 1, 1)
    """
    newest = _newest(order_by)
    winners: dict[Any, SourceRecord] = {}
    for record in source:
        if record.valid:
            best = winners.get(record.values.get(key))
            if best is None or _ordered(newest(record)) > _ordered(newest(best)):
                winners[record.values.get(key)] = record
    known = {(record.values.get(key), record.at) for record in source if record.valid}
    rows: dict[Any, list[Coordinates]] = defaultdict(list)
    for row_key, at in sink:
        rows[row_key].append(tuple(at))  # type: ignore[arg-type]
    counted: dict[str, Any] = {
        "expected": len(winners),
        "lost": 0,
        "duplicated": 0,
        "unexpected": 0,
        "sink_records": sum(len(held) for held in rows.values()),
        "samples": {},
    }
    found = []
    for row_key in winners.keys() | rows.keys():
        held = rows.get(row_key, [])
        explained = sum(1 for at in held if (row_key, at) in known)
        if row_key in winners and winners[row_key].at not in held:
            counted["lost"] += 1
            found.append(("lost", row_key, {key: row_key, "found": "no row with its latest record"}))
        if explained > 1:
            counted["duplicated"] += explained - 1
            found.append(("duplicated", row_key, {key: row_key, "rows": explained}))
        if len(held) > explained:
            counted["unexpected"] += len(held) - explained
            found.append(("unexpected", row_key, {key: row_key, "rows": len(held) - explained}))
    counted["samples"] = _pick(found)
    superseded = _after_first(
        source, lambda r: r.values.get(key), newest_first=True, order=lambda r: _ordered(newest(r))
    )
    return _counts(_quarantine_side(source, quarantine), counted, superseded=superseded)


def _ordered(rank: tuple[bool, Any, Coordinates]) -> tuple[bool, Any, Coordinates]:
    """A rank whose times compare with each other (aware UTC datetimes) and never with the null stand-in."""
    present, value, at = rank
    if isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return present, value if present else 0, at


def check_totals(
    source: Sequence[SourceRecord],
    sink: Iterable[tuple[Any, int, dict[str, Any]]],
    quarantine: Iterable[Coordinates],
    by: str,
    sums: list[str],
) -> Counts:
    """One row per ``by`` group holding the exact sums of ``sums`` and the record count; ``sink`` holds each row's
    (group, events, {column: sum}). A null value counts as 0 in the expected sums; a held null sum is compared as
    null, so it is a wrong value (counted in ``duplicated`` and in ``wrong_values``), named with both values.

    >>> source = [SourceRecord(("t", 0, i), True, values={"c": "c1", "amount": 0.1}) for i in (0, 1)]
    >>> counts = check_totals(source, [("c1", 2, {"amount": Decimal("0.3")})], [], "c", ["amount"])
    >>> counts.duplicated, counts.wrong_values, counts.samples["wrong_values"][0]["held_amount"]
    (1, 1, '0.3000000000')
    """
    expected: dict[Any, list[Any]] = {}
    for record in source:
        if record.valid:
            totals = expected.setdefault(record.values.get(by), [0, *(Decimal(0) for _ in sums)])
            totals[0] += 1
            for index, column in enumerate(sums, 1):
                totals[index] += exact(record.values.get(column)) or Decimal(0)
    held: dict[Any, list[Any]] = {}
    for group, events, values in sink:
        # A held sum is null until a row of the group holds a value (as SQL's sum): a null total is never right.
        totals = held.setdefault(group, [0, 0, *(None for _ in sums)])
        totals[0] += 1
        totals[1] += int(events)
        for index, column in enumerate(sums, 2):
            value = exact(values.get(column))
            if value is not None:
                totals[index] = value if totals[index] is None else totals[index] + value
    counted: dict[str, Any] = {
        "expected": len(expected),
        "lost": 0,
        "duplicated": 0,
        "wrong_values": 0,
        "unexpected": 0,
        "sink_records": sum(totals[0] for totals in held.values()),
        "samples": {},
    }
    found = []
    for group in expected.keys() | held.keys():
        want, got = expected.get(group), held.get(group)
        both = {
            "expected_events": want[0] if want else None,
            "held_events": got[1] if got else None,
            **{f"expected_{c}": _text(want[i]) if want else None for i, c in enumerate(sums, 1)},
            **{f"held_{c}": _text(got[i]) if got else None for i, c in enumerate(sums, 2)},
        }
        if want is None:
            counted["unexpected"] += got[0] if got else 0
            found.append(("unexpected", group, {by: group, "rows": got[0] if got else 0, **both}))
        elif got is None or got[1] < want[0]:
            counted["lost"] += 1
            found.append(("lost", group, {by: group, **both}))
        elif got[1] > want[0]:  # more records than the source has: an increment applied twice
            counted["duplicated"] += 1
            found.append(("duplicated", group, {by: group, **both}))
        elif got[2:] != want[1:]:  # the right count, another (or a null) sum: a wrong value, counted in duplicated
            counted["duplicated"] += 1
            counted["wrong_values"] += 1
            found.append(("wrong_values", group, {by: group, **both}))
    counted["samples"] = _pick(found)
    superseded = _after_first(source, lambda r: r.values.get(by))
    return _counts(_quarantine_side(source, quarantine), counted, superseded=superseded)


def window_of(time: datetime, size_us: int) -> tuple[datetime, datetime]:
    """The tumbling window of ``size_us`` microseconds that holds ``time`` (aligned on the epoch, as Spark's).

    >>> [w.strftime("%H:%M") for w in window_of(datetime(2026, 1, 1, 0, 7, tzinfo=UTC), 300_000_000)]
    ['00:05', '00:10']
    """
    aware = time if time.tzinfo is not None else time.replace(tzinfo=UTC)
    micros = (aware - EPOCH) // _MICROSECOND
    start = micros - micros % size_us
    return EPOCH + start * _MICROSECOND, EPOCH + (start + size_us) * _MICROSECOND


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - EPOCH


@dataclass(frozen=True)
class Windows:
    """What a window aggregation is: event-time column, window size, group and summed columns, count or not."""

    time: str
    size_us: int
    by: tuple[str, ...]
    sums: tuple[str, ...]
    count: bool
    dedup_keys: tuple[str, ...] = ()


def check_windows(
    source: Sequence[SourceRecord],
    sink: Iterable[dict[str, Any]],
    quarantine: Iterable[Coordinates],
    windows: Windows,
    closed_through_ms: int,
) -> Counts:
    """Window rows recomputed from the valid records (the first per dedup key), every value compared: a closed
    window (its end at or before ``closed_through_ms``) must be held once with equal count and sums, an open one not
    yet. ``sink`` rows are dicts with window_start, window_end, the ``by`` columns, sum_<c> and events.

    >>> windows = Windows("event_time", 60_000_000, by=(), sums=(), count=True)
    >>> check_windows(source, sink_rows, [], windows, closed_through_ms=1767225720000).lost   # doctest: +SKIP
    0
    """
    valid = [record for record in source if record.valid]
    if windows.dedup_keys:
        first: dict[tuple[Any, ...], SourceRecord] = {}
        for record in valid:
            key = tuple(record.values.get(c) for c in windows.dedup_keys)
            if key not in first or record.at < first[key].at:
                first[key] = record
        valid = list(first.values())
    expected: dict[tuple[Any, ...], list[Any]] = {}
    for record in valid:
        time = record.values.get(windows.time)
        if time is None:
            continue
        key = (*window_of(time, windows.size_us), *(record.values.get(c) for c in windows.by))
        totals = expected.setdefault(key, [0, *(None for _ in windows.sums)])
        totals[0] += 1
        for index, column in enumerate(windows.sums, 1):
            value = exact(record.values.get(column))
            if value is not None:
                totals[index] = value if totals[index] is None else totals[index] + value
    held: dict[tuple[Any, ...], list[Any]] = {}
    for row in sink:
        start, end = (_aware(row["window_start"]), _aware(row["window_end"]))
        key = (start, end, *(row.get(c) for c in windows.by))
        if key in held:
            held[key][0] += 1
        else:
            held[key] = [1, row.get("events"), *(exact(row.get(f"sum_{c}")) for c in windows.sums)]
    closed_through = EPOCH + closed_through_ms * 1000 * _MICROSECOND
    counted: dict[str, Any] = {
        "expected": 0,
        "lost": 0,
        "duplicated": 0,
        "unexpected": 0,
        "samples": {},
        "sink_records": sum(rows[0] for rows in held.values()),
    }
    aggregated = pending = 0
    found = []
    for key in expected.keys() | held.keys():
        want, got = expected.get(key), held.get(key)
        closed = want is not None and key[1] <= closed_through
        described = {
            "window_start": key[0].isoformat(),
            "window_end": key[1].isoformat(),
            **dict(zip(windows.by, key[2:], strict=True)),
            "expected_events": want[0] if want else None,
            "held_events": got[1] if got else None,
            "rows": got[0] if got else None,
        }
        if want is not None:
            aggregated, pending = (aggregated + want[0], pending) if closed else (aggregated, pending + want[0])
        if not closed:
            if got is not None:
                counted["unexpected"] += got[0]
                found.append(("unexpected", key, described))
            continue
        assert want is not None
        counted["expected"] += 1
        fewer = windows.count and got is not None and got[1] < want[0]
        more = windows.count and got is not None and got[1] > want[0]
        if got is None or fewer:
            counted["lost"] += 1
            found.append(("lost", key, described))
        if got is None:
            continue
        # A window written twice, or holding more records, or the same count with other sums (fewer is loss).
        doubled = got[0] - 1 + (1 if more or (not fewer and got[2:] != want[1:]) else 0)
        if doubled:
            counted["duplicated"] += doubled
            found.append(("duplicated", key, described))
    counted["samples"] = _pick(found)
    upstream = (
        _after_first(source, lambda r: tuple(r.values.get(c) for c in windows.dedup_keys))
        if (windows.dedup_keys)
        else 0
    )
    return _counts(
        _quarantine_side(source, quarantine),
        counted,
        upstream_duplicates=upstream,
        aggregated=aggregated,
        pending=pending,
    )


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
