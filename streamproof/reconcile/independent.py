"""``streamproof verify --independent``: reconcile without Spark and without the pipeline's code paths.

The source topic is read with ``confluent-kafka`` (read_committed, from the first offset to the end), each value
parsed by :mod:`streamproof.reconcile.own_schema`; Delta tables with delta-rs (the ``deltalake`` package),
PostgreSQL with psycopg, Kafka sink topics with ``confluent-kafka``, Parquet folders with pyarrow (only the files
Spark's ``_spark_metadata`` log committed); which records were late comes from the checkpoint's offset log, read
here as text, and so is how far a pipeline not run to its end has read (:mod:`streamproof.reconcile.own_cut`). The
judgement is :mod:`streamproof.reconcile.pure`. What it shares with the pipeline: the pipeline file and its parsing
(:mod:`streamproof.config`), the Kafka connection settings, the rules of the cut
(:mod:`streamproof.reconcile.read_through`), and the verdict's report (:class:`~streamproof.reconcile.report.Report`);
docs/guarantees.md lists it.

Example::

    >>> [report.verdict for report in verify_independently(load_pipeline("orders.toml"))]   # doctest: +SKIP
    ['ok']
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from datetime import timedelta
from typing import Any
from urllib.parse import unquote, urlparse

import psycopg
import pyarrow.parquet as pq
from deltalake import DeltaTable

from streamproof.config import (
    COORDINATES,
    DeltaSinkSpec,
    FilesSinkSpec,
    KafkaSinkSpec,
    PipelineSpec,
    PostgresSinkSpec,
    PythonSinkSpec,
    duration_seconds,
)
from streamproof.errors import ConfigError, PipelineError
from streamproof.kafka_client import secured_client_config
from streamproof.reconcile.counts import (
    LATE_TERMS,
    Counts,
    check_for,
    source_gone,
    unverifiable_maybe_late,
    unverifiable_without,
)
from streamproof.reconcile.own_cut import (
    batch_ids,
    closed_through_ms,
    offset_log,
    read_through,
    sink_position,
    split_read,
    tried,
)
from streamproof.reconcile.own_schema import RecordSchema
from streamproof.reconcile.own_source import consume_topic, first_offsets_held, read_source
from streamproof.reconcile.pure import (
    EPOCH,
    SourceRecord,
    Windows,
    check_latest,
    check_records,
    check_totals,
    check_windows,
    window_of,
)
from streamproof.reconcile.read_through import Partition, ReadThrough, judged_cut, shown, with_unread
from streamproof.reconcile.report import RECOMPUTED, UNCHECKED, Report, unlogged_late_basis
from streamproof.reconcile.stored import S3_SCHEMES, StoredFolder

TERMS = ("expected", "quarantined", "upstream_duplicates", "superseded", "dropped_late")
# Every figure both checkers produce: they must agree on each.
COMPARED = (
    "source_records",
    *TERMS,
    "not_yet_read",
    "aggregated",
    "pending",
    "sink_records",
    "lost",
    "duplicated",
    "wrong_values",
    "unexpected",
    "unavailable",
)


def flag_late(spec: PipelineSpec, source: list[SourceRecord], quarantine: list[tuple[Any, ...]]) -> str:
    """Mark the late records (no longer valid; dropped with ``dedup.late = "drop"``) from the offset log: a record
    of batch N is late when its event time (dedup) or window end (windows alone) is at or before batch N-1's
    watermark. When the log no longer starts at batch 0, the batches after its first entry are recomputed all the
    same; a valid record of the batches before them (below the first entry's end offsets) newer than the first
    entry's own watermark (the latest they can have used: a watermark never moves back) was not late; an older one
    is late if the quarantine table lists it so (``late = "quarantine"``), or, with ``late = "drop"``, marked
    ``maybe_late`` for each sink to judge (:func:`maybe_late_resolved`). Returns the basis before any sink is asked:
    ``recomputed``, or what :func:`streamproof.reconcile.report.unlogged_late_basis` says.

    >>> flag_late(spec, source, quarantine_rows)                                          # doctest: +SKIP
    'recomputed'
    """
    transform = spec.transform
    assert transform.watermark is not None
    checkpoint = StoredFolder.at(spec.checkpoint_dir, "the checkpoint", spec.spark.conf)
    batches = batch_ids(checkpoint, "offsets")
    first = batches[0] if batches else 0
    bound, unlogged = offset_log(checkpoint, first) if first else (0, {})
    column = transform.watermark[0]
    size_us = (
        _window_us(transform.aggregate.window) if transform.aggregate is not None and transform.dedup is None else 0
    )
    ranges: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    previous, watermark = unlogged, bound
    for batch_id in batches[1:] if first else batches:
        late_watermark = watermark  # batch N's late records are judged by batch N-1's watermark
        watermark, ends = offset_log(checkpoint, batch_id)
        for topic, partitions in ends.items():
            for partition, end in partitions.items():
                start = previous.get(topic, {}).get(partition, 0)
                ranges.setdefault((topic, int(partition)), []).append((start, end, late_watermark))
        previous = ends
    drop = transform.late == "drop"
    listed_late = {tuple(row[:3]) for row in quarantine if row[3] == "late"}
    maybe_late = 0
    for record in source:
        time = record.values.get(column)
        if not record.valid or time is None:
            continue
        behind = window_of(time, size_us)[1] if size_us else time
        if record.at[2] < unlogged.get(record.at[0], {}).get(str(record.at[1]), 0):  # a batch no longer logged
            if bound > 0 and behind <= EPOCH + timedelta(milliseconds=bound):
                maybe_late += 1
                if drop:
                    record.maybe_late = True
                elif record.at in listed_late:
                    record.valid = False
            continue
        for start, end, late_watermark in ranges.get(record.at[:2], []):
            if start <= record.at[2] < end:
                if late_watermark > 0 and behind <= EPOCH + timedelta(milliseconds=late_watermark):
                    record.valid, record.dropped = False, drop
                break
    if not first:
        return RECOMPUTED
    return unlogged_late_basis(first, transform.late, maybe_late, maybe_late if drop else 0)


def maybe_late_resolved(
    source: list[SourceRecord], held: set[tuple[Any, ...]] | None, key_columns: list[str] | None
) -> tuple[list[SourceRecord], int]:
    """The records with each ``maybe_late`` one (``late = "drop"``, a batch the offset log no longer holds) judged by
    one sink: one whose identity (its ``key_columns`` values, else its coordinates) is ``held`` was delivered, or a
    record of its key was, and stays valid; any other is counted as dropped, never as lost (it may have been dropped
    as late; the report says it is not checked). ``held`` None: a sink whose rows do not name records (a key's latest
    state, totals, windows): every one is counted as dropped. Returns the records and how many were.

    >>> maybe = SourceRecord(("t", 0, 0), True, maybe_late=True, values={"id": "e1"})
    >>> [(r.valid, r.dropped) for r in maybe_late_resolved([maybe], {("e1",)}, ["id"])[0]]
    [(True, False)]
    >>> maybe_late_resolved([maybe], set(), ["id"])[1]
    1
    """
    judged, unseen = [], 0
    for record in source:
        if record.maybe_late:
            identity = tuple(record.values.get(c) for c in key_columns) if key_columns else record.at
            if held is None or None in identity or identity not in held:  # a null key matches no row (as a join)
                record = replace(record, valid=False, dropped=True)
                unseen += 1
        judged.append(record)
    return judged, unseen


def read_delta(table_folder: StoredFolder, columns: list[str]) -> list[tuple[Any, ...]] | None:
    """The table's rows (these columns) with delta-rs; None when there is no table yet.

    >>> from streamproof.storage.location import Location
    >>> read_delta(StoredFolder.at(Location("/nonexistent"), "a table"), ["order_id"]) is None
    True
    """
    if not table_folder.is_dir("_delta_log"):
        return None
    table = DeltaTable(table_folder.uri, storage_options=table_folder.storage_options or None).to_pyarrow_table(
        columns=columns
    )
    return list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def _read_postgres(sink: PostgresSinkSpec, columns: list[str]) -> list[tuple[Any, ...]] | None:
    try:
        connection = psycopg.connect(sink.conninfo())
    except psycopg.OperationalError as error:
        reason = str(error).strip().splitlines()[-1].strip() if str(error).strip() else type(error).__name__
        raise PipelineError(
            f"cannot connect to {sink.redacted()} for sink {sink.name}: {reason}; start it with `streamproof infra up "
            "--postgres` or fix the sink's host, port, user and password variable"
        ) from None
    with connection:
        exists = connection.execute("SELECT to_regclass(%s)", (f"{sink.db_schema}.{sink.table}",)).fetchone()
        if exists is None or exists[0] is None:
            return None
        selected = ", ".join(f'"{c}"' for c in columns)
        return [tuple(row) for row in connection.execute(f'SELECT {selected} FROM "{sink.db_schema}"."{sink.table}"')]


def _read_kafka_sink(sink: KafkaSinkSpec, columns: list[str]) -> list[tuple[Any, ...]]:
    config = secured_client_config(sink.bootstrap_servers, sink.kafka_options)
    rows = []
    for _, _, value in consume_topic(config, sink.topic):
        document = json.loads(value or b"{}")
        rows.append(tuple(document.get(c) for c in columns))
    return rows


def committed_parquet_files(folder: StoredFolder) -> list[str]:
    """The data files Spark's file sink committed: its ``_spark_metadata`` log (the latest ``N.compact`` and every
    entry after it), never a file a killed write left behind. A folder without the log (unkeyed writes: plain
    Parquet appends) is read as Spark reads it: every data file not hidden by a leading ``_`` or ``.``.

    >>> from streamproof.storage.location import Location
    >>> committed_parquet_files(StoredFolder.at(Location("/nonexistent"), "a folder"))
    []
    """
    if not folder.is_dir("_spark_metadata"):
        return [
            folder.path(name)
            for name in folder.files(".parquet")
            if not any(part[0] in "_." for part in name.split("/"))
        ]
    names = folder.names("_spark_metadata")
    entries = sorted((int(name.split(".")[0]), name) for name in names if name.split(".")[0].isdigit())
    compacts = [batch for batch, name in entries if name.endswith(".compact")]
    first = compacts[-1] if compacts else -1
    files: dict[str, bool] = {}
    for batch, name in entries:
        if batch < first or (batch == first and not name.endswith(".compact")):
            continue
        for line in folder.read_text(f"_spark_metadata/{name}").splitlines()[1:]:
            entry = json.loads(line)
            files[entry["path"]] = entry.get("action", "add") == "add"
    return [_stored_path(name) for name, added in files.items() if added]


def _stored_path(uri: str) -> str:
    """A file Spark's log names by its URI, as the folder's own filesystem names it: on S3 the bucket and the key (the
    URI's path alone would lose the bucket), elsewhere the path.

    >>> _stored_path("s3a://streamproof/orders/part-0.parquet"), _stored_path("hdfs://nn:9000/t/part%201.parquet")
    ('streamproof/orders/part-0.parquet', '/t/part 1.parquet')
    """
    parsed = urlparse(uri)
    path = unquote(parsed.path)
    return f"{parsed.netloc}{path}" if parsed.scheme in S3_SCHEMES else path


def _read_files(folder: StoredFolder, columns: list[str]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for file in committed_parquet_files(folder):
        table = pq.read_table(file, columns=columns, filesystem=folder.filesystem)
        rows += zip(*(table.column(c).to_pylist() for c in columns), strict=True)
    return rows


def read_sink(spec: PipelineSpec, sink: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    """A sink's rows (these columns), by its own kind of reader; an empty list for a sink not written yet.

    >>> read_sink(spec, spec.sink_specs[0], ["_src_topic", "_src_partition", "_src_offset"])[0]  # doctest: +SKIP
    ('orders', 0, 0)
    """
    if isinstance(sink, DeltaSinkSpec):
        rows = read_delta(StoredFolder.at(spec.resolve_path(sink.path), f"sink {sink.name}", spec.spark.conf), columns)
    elif isinstance(sink, PostgresSinkSpec):
        rows = _read_postgres(sink, columns)
    elif isinstance(sink, KafkaSinkSpec):
        rows = _read_kafka_sink(sink, columns)
    elif isinstance(sink, FilesSinkSpec):
        rows = _read_files(StoredFolder.at(spec.resolve_path(sink.path), f"sink {sink.name}", spec.spark.conf), columns)
    else:
        raise ConfigError(f"verify --independent cannot read a {sink.kind} sink: use `streamproof verify`")
    return rows or []


def judge_sink(
    spec: PipelineSpec,
    sink: Any,
    source: list[SourceRecord],
    quarantine: list[Any],
    lows: dict[Partition, int],
    cut: ReadThrough,
) -> tuple[Counts, str, ReadThrough, str]:
    """One sink's counts over the records its rows and the quarantine account for (the rules of
    :mod:`streamproof.reconcile.read_through`), with the others as ``not_yet_read``; their unit, the cut they were
    made by, and why they cannot be trusted ("": they can).

    >>> judge_sink(spec, spec.sink_specs[0], source, quarantine, {}, read_through(spec))[0].lost  # doctest: +SKIP
    0
    """
    transform = spec.transform
    dedup_keys = list(transform.dedup.key_columns) if transform.dedup else None
    coordinates = list(COORDINATES)
    if transform.aggregate is not None:
        aggregate = transform.aggregate
        time = transform.watermark[0] if transform.watermark else ""
        windows = Windows(
            time,
            _window_us(aggregate.window),
            tuple(aggregate.by),
            tuple(aggregate.sum),
            aggregate.count,
            tuple(dedup_keys or ()),
        )
        columns = [
            "window_start",
            "window_end",
            *aggregate.by,
            *(f"sum_{c}" for c in aggregate.sum),
            *(["events"] if aggregate.count else []),
        ]
        rows = [dict(zip(columns, row, strict=True)) for row in read_sink(spec, sink, columns)]
        sink_cut, why = judged_cut(cut, bool(rows), bool(quarantine))
        committed_ms = closed_through_ms(spec)  # the windows closed at C, at P, and at C for the source's end
        closed = [committed_ms, sink_cut.planned_watermark_ms, committed_ms]

        def windows_of(read: list[SourceRecord], at: int) -> Counts:
            return check_windows(read, rows, quarantine, windows, closed[at])

        return tried(source, sink_cut, quarantine, windows_of), "windows", sink_cut, why
    check = check_for(sink)
    if check.kind == "latest":
        assert check.key is not None and check.order_by is not None
        held = read_sink(spec, sink, [check.key, *coordinates])
        sink_cut, why = judged_cut(cut, bool(held), bool(quarantine))
        read, unread = split_read(source, sink_cut, quarantine, at=sink_position(sink_cut, [r[1:] for r in held]))
        latest = [(r[0], tuple(r[1:])) for r in held]
        counts = check_latest(read, latest, quarantine, check.key, check.order_by)
        return with_unread(counts, unread), check.unit, sink_cut, why
    if check.kind == "totals":
        assert check.by is not None
        held = read_sink(spec, sink, [check.by, "events", *check.sums])
        totals = [(r[0], r[1], dict(zip(check.sums, r[2:], strict=True))) for r in held]
        sink_cut, why = judged_cut(cut, bool(held), bool(quarantine))
        by, sums = check.by, list(check.sums)

        def totals_of(read: list[SourceRecord], _: int) -> Counts:
            return check_totals(read, totals, quarantine, by, sums)

        return tried(source, sink_cut, quarantine, totals_of), check.unit, sink_cut, why
    identity = dedup_keys or coordinates
    held = read_sink(spec, sink, [*identity, *(coordinates if dedup_keys else [])])
    unavailable = 0
    if lows and not dedup_keys:  # rows of records gone from the source are set aside, not compared
        kept = [row for row in held if not source_gone(lows, *row)]
        unavailable, held = len(held) - len(kept), kept
    sink_cut, why = judged_cut(cut, bool(held), bool(quarantine))
    if dedup_keys:  # rows of dedup keys, each with its first record's coordinates
        at = sink_position(sink_cut, [row[len(identity) :] for row in held])
        read, unread = split_read(source, sink_cut, quarantine, at=at)
        held = [row[: len(identity)] for row in held]
    else:
        read, unread = split_read(source, sink_cut, quarantine, held=held)
    counts = with_unread(check_records(read, held, quarantine, dedup_keys), unread)
    counts.unavailable = unavailable
    return counts, check.unit, sink_cut, why


def _window_us(size: str) -> int:
    return int(round(duration_seconds(size) * 1_000_000))


def verify_independently(spec: PipelineSpec) -> list[Report]:
    """Read the topic, checkpoint, quarantine and sinks without Spark and reconcile: one report per sink.

    >>> [report.verdict for report in verify_independently(spec)]                          # doctest: +SKIP
    ['ok']
    """
    transform = spec.transform
    summed = transform.aggregate.sum if transform.aggregate is not None else []
    schema = RecordSchema.parse(transform.schema_, transform.required, summed)
    cut = read_through(spec)  # before the source, so that the source holds at least what the checkpoint names
    source = read_source(spec, schema)
    quarantine_table = StoredFolder.at(spec.quarantine_path, "the quarantine table", spec.spark.conf)
    quarantine_rows = read_delta(quarantine_table, [*COORDINATES, "reason"]) or []
    basis = dict.fromkeys(TERMS, RECOMPUTED)
    late_terms = LATE_TERMS[transform.late]
    if transform.watermark is not None:
        basis |= dict.fromkeys(late_terms, flag_late(spec, source, quarantine_rows))
    maybe_late = sum(1 for record in source if record.maybe_late)
    lows = first_offsets_held(spec)
    quarantine = [tuple(row[:3]) for row in quarantine_rows if not source_gone(lows, *row[:3])]
    reasons: dict[str, int] = {}
    for row in quarantine_rows:
        reasons[row[3]] = reasons.get(row[3], 0) + 1
    reports = []
    for sink in spec.sink_specs:
        if transform.user_code is not None or isinstance(sink, PythonSinkSpec):
            reports.append(_your_code_report(spec, sink, source, quarantine, reasons, cut))
            continue
        unverifiable = unverifiable_without(
            lows, check_for(sink), transform.dedup is not None, transform.aggregate is not None
        )
        judged, sink_basis = source, dict(basis)
        if maybe_late:  # late = "drop", and the offset log no longer holds the batches of some older records
            judged, sink_basis, unverifiable = maybe_late_judged(spec, sink, source, basis, unverifiable)
        counts, unit, sink_cut, why = judge_sink(spec, sink, judged, quarantine, lows, cut)
        reports.append(
            Report(
                pipeline=spec.name,
                guarantee=spec.guarantee,
                sink=sink.name,
                unit=unit,
                quarantine_reasons=dict(sorted(reasons.items())),
                basis=sink_basis,
                unverifiable=unverifiable or why,
                **asdict(counts),
                **shown(sink_cut),
            )
        )
    return reports


# What the independent checker can check of a pipeline with your own transform, and what it cannot.
YOUR_CODE_UNKNOWN = (
    f"{UNCHECKED}what your transform makes of the records is known only by running it in Spark: "
    "`streamproof verify` recomputes it"
)
YOUR_CODE_CHECKED = ("source_records", "quarantined", "quarantine_lost", "transformed", "sink_records", "not_yet_read")


def _your_code_report(
    spec: PipelineSpec,
    sink: Any,
    source: list[SourceRecord],
    quarantine: list[Any],
    reasons: dict[str, int],
    cut: ReadThrough,
) -> Report:
    """A sink of a pipeline with your own transform, without Spark: the quarantine side and the identity's source
    terms are checked as for any pipeline; the sink's rows are only counted (their expected content is your code's
    output, which only Spark can compute), so the sink's terms are ``unknown``. The records read: those below the
    sink's position (its rows keep their records' coordinates; totals name none: below the committed bounds)."""
    check = check_for(sink)
    counted = [check.by] if check.kind == "totals" else list(COORDINATES)
    yours = isinstance(sink, PythonSinkSpec)  # your sink: only your read function (in Spark) says what it holds
    held = [] if yours else read_sink(spec, sink, [c for c in counted if c])
    sink_cut, why = judged_cut(cut, bool(held), bool(quarantine))
    at = sink_position(sink_cut, held) if check.kind != "totals" else dict(sink_cut.committed)
    read, unread = split_read(source, sink_cut, quarantine, at=at)
    side = with_unread(check_records(read, [], quarantine), unread)
    transformed = sum(1 for record in read if record.valid)  # what the identity's delivered term counts
    counts = replace(
        side,
        expected=0,
        lost=side.quarantine_lost,
        sink_records=len(held),
        your_code=True,
        transformed=transformed,
        samples={},
    )
    basis = {"expected": YOUR_CODE_UNKNOWN, "quarantined": RECOMPUTED}
    if yours:
        basis["sink_records"] = f"{UNCHECKED}your sink is read by your read function, in Spark: `streamproof verify`"
        if unread.rows:  # which records past the committed bounds it holds: only its read function says
            basis["not_yet_read"] = basis["transformed"] = (
                f"{UNCHECKED}which records past the checkpoint's committed batch your sink holds is known only to "
                "your read function, in Spark: `streamproof verify`"
            )
    unit = {"records": "rows"}.get(check.kind, check.unit)
    return Report(
        pipeline=spec.name,
        guarantee=spec.guarantee,
        sink=sink.name,
        unit=unit,
        quarantine_reasons=dict(sorted(reasons.items())),
        basis=basis,
        unverifiable=why,
        **asdict(counts),
        **shown(sink_cut),
    )


def maybe_late_judged(
    spec: PipelineSpec, sink: Any, source: list[SourceRecord], basis: dict[str, str], unverifiable: str
) -> tuple[list[SourceRecord], dict[str, str], str]:
    """The records, the basis and why the counts cannot be trusted (``unverifiable``, kept when already set), for
    one sink whose ``maybe_late`` records its own rows judge (:func:`maybe_late_resolved`).

    >>> judged, basis, why = maybe_late_judged(spec, spec.sink_specs[0], source, basis, "")  # doctest: +SKIP
    """
    transform = spec.transform
    dedup_keys = list(transform.dedup.key_columns) if transform.dedup else None
    maybe_late = sum(1 for record in source if record.maybe_late)
    first = batch_ids(StoredFolder.at(spec.checkpoint_dir, "the checkpoint", spec.spark.conf), "offsets")[0]
    named = transform.aggregate is None and check_for(sink).kind == "records"  # rows that name their records
    held = None
    if named:
        held = {tuple(row) for row in read_sink(spec, sink, dedup_keys or list(COORDINATES))}
    judged, unseen = maybe_late_resolved(source, held, dedup_keys)
    if not named:
        unverifiable = unverifiable or unverifiable_maybe_late(maybe_late, first)
    late_basis = unlogged_late_basis(first, transform.late, maybe_late, unseen)
    return judged, basis | dict.fromkeys(LATE_TERMS[transform.late], late_basis), unverifiable


def disagreements(spark_reports: list[Report], independent_reports: list[Report]) -> list[str]:
    """Every term on which the two checkers differ, one line each (empty: they agree term by term).

    >>> disagreements([], [])
    []
    """
    lines = []
    for spark, own in zip(spark_reports, independent_reports, strict=True):
        # A sink of your own in a pipeline without your transform: Spark's checker counts it by records, so the
        # records your code was given are the independent report's term only.
        compared = (
            COMPARED
            if not own.your_code
            else [
                term
                for term in YOUR_CODE_CHECKED
                if not own.basis.get(term, "").startswith(UNCHECKED) and (term != "transformed" or spark.your_code)
            ]
        )
        for term in compared:
            if getattr(spark, term) != getattr(own, term):
                lines.append(
                    f"{spark.sink}: {term} {getattr(spark, term):,} (spark) != {getattr(own, term):,} (independent)"
                )
    return lines
