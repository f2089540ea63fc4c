"""Your own PySpark in a pipeline: a transform function (or one SQL query) applied to each batch's valid records,
with the lookup tables it joins, checked before it can break exactly-once (docs/your-code.md).

The contract, checked here:

* **lineage**: every output row keeps the source columns (``_src_topic``, ``_src_partition``, ``_src_offset``,
  ``_src_timestamp``) of the record it came from; verification matches rows to records by them
  (:func:`check_lineage`, at start on the function's output schema and on every batch's rows);
* **determinism** (exactly-once): the same records give the same rows, so a batch replayed after a crash writes
  what its first attempt did. Refused at start when Spark's analysed plan says otherwise (``rand()``, ``uuid()``, a
  nondeterministic UDF) or names the clock (``current_timestamp()``); on the first batch of every run the function
  is applied twice to the same sample of records, and rows that differ are refused, the first one named
  (:func:`check_determinism`: catches a Python UDF that reads the clock or draws a random number);
* **lookups**: a ``[[lookups]]`` Delta table is read at the version recorded for the batch
  (:class:`LookupVersions`), so a replay joins what its first attempt joined (``pin = false``: the newest).

The batch writer (:mod:`streamproof.pipeline.batches`) and verification (:mod:`streamproof.reconcile.history`, the
oracle: the same function over the source records, batch by batch with their recorded lookup versions) both call
:meth:`YourCode.apply`.

Example::

    >>> code = YourCode.of(spec)                                                     # doctest: +SKIP
    >>> rows = code.apply(valid_rows, code.versions_for(batch))                      # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from streamproof.config import PipelineSpec, replay_unsafe
from streamproof.errors import ConfigError, PipelineError
from streamproof.storage.claimed_log import ClaimedLog
from streamproof.storage.location import Location
from streamproof.transform.records import SOURCE_COLUMNS, sink_rows_schema, users_analysis_errors
from streamproof.your_code.modules import importable_beside, load_function, ship_module

RECORDS_VIEW = "records"  # the view a [transform] sql query reads the batch's valid records from
DETERMINISM_SAMPLE = 500  # records of a run's first batch the function is applied to twice
PROBE_PARTITIONS = 3  # the partitions the second application gets the sample in (the first gets one)

Offsets = dict[str, dict[str, int]]


def function_name(function: Callable[..., Any]) -> str:
    """How a pipeline file names a function given in Python (``Pipeline(transform={"function": f})``): the crash
    runs and verification import it by that name in other processes, so it must be defined at the top level of an
    importable module.

    >>> function_name(json.dumps)
    'json:dumps'
    >>> function_name(lambda rows: rows)
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: transform.function: <lambda> is not defined at the top level of a module; ...
    """
    module, qualified = getattr(function, "__module__", None), getattr(function, "__qualname__", "?")
    if not module or "." in qualified or "<" in qualified:
        raise ConfigError(
            f"transform.function: {qualified} is not defined at the top level of a module; streamproof "
            "imports it by name in the processes it runs and crashes: define it with def in a module"
        )
    if module == "__main__":
        raise ConfigError(
            f"transform.function: {qualified} is defined in the script being run (__main__), which "
            "the processes streamproof runs and crashes cannot import: move it to a module"
        )
    return f"{module}:{qualified}"


def check_lineage(columns: list[str], what: str) -> None:
    """Refuse output rows that lost a lineage column: verification could not tell which record a row came from.

    >>> check_lineage(["order_id", "_src_topic", "_src_partition"], "transform.python (shop:enrich)")
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: transform.python (shop:enrich) returns rows without _src_offset, _src_timestamp: ...
    """
    missing = [column for column in SOURCE_COLUMNS if column not in columns]
    if missing:
        raise ConfigError(
            f"{what} returns rows without {', '.join(missing)}: keep the source columns on every row "
            '(select "*" or name them): verification matches each row to its record by them'
        )


@dataclass
class YourCode:
    """The pipeline's own transform and lookups, ready to apply to a batch (or to the source, in verification)."""

    spec: PipelineSpec
    function: Callable[..., Any] | None
    sql: str | None

    @classmethod
    def of(cls, spec: PipelineSpec) -> YourCode | None:
        """The pipeline's code, its function imported (the pipeline file's folder is on the import path, as a
        test's folder is for pytest); None when the pipeline has none."""
        transform = spec.transform
        if transform.user_code is None:
            return None
        importable_beside(spec)
        function = load_function(transform.python) if transform.python is not None else None
        return cls(spec, function, transform.sql)

    def ship(self, spark: SparkSession) -> None:
        """Send the function's package to Spark's Python workers (:func:`ship_module`)."""
        if self.spec.transform.python is not None:
            ship_module(spark, self.spec.transform.python)

    @property
    def what(self) -> str:
        return self.spec.transform.user_code or "transform"

    def latest_versions(self, spark: SparkSession) -> dict[str, int]:
        """The newest version of each lookup table."""
        return {
            lookup.name: lookup_version_now(spark, self.spec.resolve_path(lookup.path), lookup.name)
            for lookup in self.spec.lookups
        }

    def lookups(self, spark: SparkSession, versions: dict[str, int]) -> dict[str, DataFrame]:
        """Each lookup table as a DataFrame at its version in ``versions``."""
        return {
            lookup.name: spark.read.format("delta")
            .option("versionAsOf", versions[lookup.name])
            .load(str(self.spec.resolve_path(lookup.path)))
            for lookup in self.spec.lookups
        }

    def apply(self, records: DataFrame, versions: dict[str, int] | None = None) -> DataFrame:
        """Your function (or query) on ``records`` (valid records, with lineage), lookups at ``versions``."""
        spark = records.sparkSession
        tables = self.lookups(spark, versions or {}) if self.spec.lookups else {}
        if self.sql is not None:
            records.createOrReplaceTempView(RECORDS_VIEW)
            for name, table in tables.items():
                table.createOrReplaceTempView(name)
            return _analysed(lambda: spark.sql(self.sql), self.what)  # type: ignore[arg-type]
        assert self.function is not None
        function = self.function
        takes_lookups = len(inspect.signature(function).parameters) >= 2
        output = _analysed(lambda: function(records, tables) if takes_lookups else function(records), self.what)
        if not isinstance(output, DataFrame):
            raise ConfigError(f"{self.what} returned {type(output).__name__}, not a DataFrame: return the rows")
        return output

    def check_at_start(self, spark: SparkSession, records_schema: StructType, *, exactly_once: bool) -> StructType:
        """Apply the code to no records before the query starts: its lineage, the columns the sinks name, and
        (exactly-once) what Spark's plan says of its determinism. Returns the schema of its rows.

        >>> YourCode.of(spec).check_at_start(spark, schema, exactly_once=True)            # doctest: +SKIP
        StructType([...])
        """
        empty = spark.createDataFrame([], records_schema)
        output = self.apply(empty, self.latest_versions(spark) if self.spec.lookups else None)
        check_lineage(output.columns, self.what)
        for sink in self.spec.sink_specs:
            for key, column in sink.schema_columns():
                if column not in output.columns:
                    raise ConfigError(
                        f"sink {sink.name}: {key} = {column!r} is not a column of the rows "
                        f"{self.what} returns ({', '.join(output.columns)})"
                    )
        if exactly_once:
            plan = output._jdf.queryExecution().analyzed()
            unsafe = replay_unsafe(plan.toString())
            if unsafe or not plan.deterministic():
                why = unsafe or "Spark's plan of it is nondeterministic (rand(), uuid(), shuffle() or such a UDF)"
                raise ConfigError(
                    f"{self.what}: {why}, so a batch replayed after a crash would write other rows and "
                    "exactly-once cannot hold; derive every value from the record and the lookups"
                )
        return output.schema


def your_rows_schema(spark: SparkSession, spec: PipelineSpec, *, exactly_once: bool) -> StructType | None:
    """The schema of the rows the pipeline's own transform makes, checked before the query starts
    (:meth:`YourCode.check_at_start`); None for a pipeline without one (its sinks take the record schema).

    >>> your_rows_schema(spark, load_pipeline("shop.toml"), exactly_once=True).fieldNames()[:2]  # doctest: +SKIP
    ['order_id', 'line_id']
    """
    code = YourCode.of(spec)
    if code is None:
        return None
    code.ship(spark)
    return code.check_at_start(spark, sink_rows_schema(spark, spec.transform), exactly_once=exactly_once)


def _analysed(make: Callable[[], Any], what: str) -> Any:
    """Build the user's DataFrame; Spark's analysis error (a column that is not there, a bad query) in one line."""
    with users_analysis_errors(f"{what} cannot be applied to the records"):
        return make()


def check_determinism(code: YourCode, records: DataFrame, versions: dict[str, int] | None) -> bool:
    """Apply the code twice to the same sample of a batch's records and refuse rows that differ, naming the first;
    False when the batch has no record to try it on (the next batch is tried).

    The sample is collected first, so both applications get the same records: once in one partition, in the order
    they came; once in reverse order across :data:`PROBE_PARTITIONS` partitions, as a replay or verification may cut and
    order them. Code whose rows depend on a clock, a random number, the order of the records or their partitioning
    (``row_number`` over an order with ties, ``dropDuplicates``, ``first``) gives other rows. A difference is a
    :class:`~streamproof.errors.PipelineError` (the run stops before its first write).

    >>> check_determinism(code, valid_rows, None)                                      # doctest: +SKIP
    """
    sample = records.limit(DETERMINISM_SAMPLE).collect()
    if not sample:
        return False
    spark = records.sparkSession
    as_read = spark.createDataFrame(sample, records.schema).coalesce(1)
    reordered = spark.createDataFrame(sample[::-1], records.schema).repartition(PROBE_PARTITIONS)
    applied = [code.apply(as_read, versions), code.apply(reordered, versions)]
    first, second = (Counter(map(_hashable, rows.collect())) for rows in applied)
    if first == second:
        return True
    differing = sorted((first - second).elements(), key=repr) or sorted((second - first).elements(), key=repr)
    row = dict(zip(applied[0].columns, differing[0], strict=False))
    raise PipelineError(
        f"{code.what} gave other rows when applied twice to the same {len(sample)} records, in another order and "
        f"partitioning the second time (first differing: {_short(row)}): a batch replayed after a crash would write "
        "other values, so exactly-once cannot hold; derive every value from the record and the lookups (no clock, "
        "no random numbers, nothing that depends on which records share a batch or in which order they come)"
    )


def _hashable(row: Any) -> tuple[Any, ...]:
    """A row as a value a Counter can hold and compare: lists and structs as tuples, maps as JSON, bytes as bytes,
    a NaN as a name (NaN never equals itself).

    >>> _hashable([1.0, float("nan"), bytearray(b"x"), {"k": [1]}])
    (1.0, 'NaN', b'x', '{"k": [1]}')
    """
    return tuple(
        _hashable(value)
        if isinstance(value, list | tuple)
        else json.dumps(value, sort_keys=True, default=str)
        if isinstance(value, dict)
        else bytes(value)
        if isinstance(value, bytearray | memoryview)
        else "NaN"
        if isinstance(value, float) and value != value
        else value
        for value in row
    )


def _short(row: dict[str, Any]) -> str:
    text = ", ".join(f"{name}={value!r}" for name, value in row.items())
    return text if len(text) <= 300 else text[:297] + "..."


def lookup_version_now(spark: SparkSession, path: Location, name: str) -> int:
    """The newest version of the Delta table at ``path`` (a lookup), or a one-line error when it is not one."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, str(path)):
        raise ConfigError(f"lookups: {name!r} at {path} is not a Delta table: create it, or fix its path")
    row = DeltaTable.forPath(spark, str(path)).history(1).select("version").first()
    assert row is not None
    return int(row[0])


class LookupVersions:
    """``<checkpoint>.streamproof/lookups/`` (:attr:`PipelineSpec.state_dir`, beside the checkpoint, so that a
    restored or recovered checkpoint keeps it: :meth:`of`): the lookup versions each batch read, as segments of batches.

    A segment starts at a batch (and its start offsets, by which verification finds its records) and holds the
    versions its batches read; a new one starts when a lookup table changed. ``through`` is the last batch
    recorded. Each change is a new entry of a log, ``<n>.json``, created only if absent (never torn, never written
    over), before the batch writes anything, so a batch that reached a sink is always recorded; the newest entry is the
    record. A pinned lookup of a batch at or below ``through`` (a replay) gets its recorded version; an unpinned one
    the newest, and the record is rewritten from that batch on (it says what the batch's last attempt read).

    A run claims the log for its lease (:meth:`fence`, an entry naming it) before its first batch: a run paused past
    its lease and woken after another took over finds the newer run's entry, or loses the race for the next entry's
    name, and writes nothing (``tests/test_your_code.py::test_a_run_that_lost_its_lease_never_rewrites_the_lookup_
    record``).

    >>> import tempfile
    >>> record = LookupVersions(Location(tempfile.mkdtemp()))
    >>> record.remember(0, {}, {"customers": 1}), record.remember(1, {"t": {"0": 5}}, {"customers": 2})
    (None, None)
    >>> record.recorded(0), record.recorded(1), record.recorded(2)
    ({'customers': 1}, {'customers': 2}, None)
    """

    FOLDER = "lookups"
    NAME = "lookups.json"  # the single file kept before the log (rewritten in place): read while the log is empty
    IN_CHECKPOINT = "_streamproof_lookups.json"  # where it was kept before that, inside the checkpoint: read if alone
    KEPT = ClaimedLog.KEPT

    def __init__(self, folder: Location, earlier: Location | None = None) -> None:
        self.log = ClaimedLog(folder / self.FOLDER, "the lookup versions each batch read")
        self.path = folder / self.NAME
        self.earlier = earlier

    @classmethod
    def of(cls, spec: PipelineSpec) -> LookupVersions:
        """The pipeline's record, beside its checkpoint."""
        return cls(spec.state_dir, earlier=spec.checkpoint_dir / cls.IN_CHECKPOINT)

    def _newest(self) -> tuple[int, dict[str, Any]]:
        """The newest entry's number (-1: none yet) and the record it holds."""
        number, text = self.log.newest_text()
        source = self.log.entry(number) if text is not None else self.path
        if text is None:
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                if self.earlier is None or not self.earlier.exists():
                    return -1, {"through": -1, "segments": []}
                source, text = self.earlier, self.earlier.read_text()
        data = self.log.parse(source, text)
        if not isinstance(data.get("segments"), list):
            raise self.log.damaged(source, text)
        return number, data

    def read(self) -> dict[str, Any]:
        return self._newest()[1]

    def fence(self, holder: str) -> None:
        """Claim the record for the lease ``holder`` (:meth:`ClaimedLog.claim`, the record unchanged): from here on
        an entry of another lease means this run lost its own, and it writes nothing more."""
        self.log.claim(holder, self._newest)

    def recorded(self, batch_id: int) -> dict[str, int] | None:
        """The versions recorded for a batch, None when it was never recorded."""
        data = self.read()
        if batch_id > data["through"]:
            return None
        segment = [s for s in data["segments"] if s["from_batch"] <= batch_id]
        return dict(segment[-1]["versions"]) if segment else None

    def remember(self, batch_id: int, start_offsets: Offsets | None, versions: dict[str, int]) -> None:
        """Record that ``batch_id`` (starting at ``start_offsets``) read ``versions``."""
        newest, data = self._newest()
        segments = [
            s
            for s in data["segments"]
            if s["from_batch"] < batch_id or (s["from_batch"] == batch_id and batch_id > data["through"])
        ]
        if not segments or segments[-1]["versions"] != versions:
            segments.append({"from_batch": batch_id, "from_offsets": start_offsets or {}, "versions": versions})
        self.log.append(newest, {"through": batch_id, "segments": segments}, read=data)

    def versions_for(
        self, spark: SparkSession, code: YourCode, batch_id: int, start_offsets: Offsets | None
    ) -> dict[str, int]:
        """The versions ``batch_id`` reads (recorded ones for pinned lookups of a replay), recorded before use."""
        recorded = self.recorded(batch_id) or {}
        kept = {lookup.name for lookup in code.spec.lookups if lookup.pin and lookup.name in recorded}
        # The newest versions cost a read of each table's history: only for the lookups the record does not settle.
        latest = code.latest_versions(spark) if len(kept) < len(code.spec.lookups) else {}
        versions = {
            lookup.name: recorded[lookup.name] if lookup.name in kept else latest[lookup.name]
            for lookup in code.spec.lookups
        }
        if recorded != versions:
            self.remember(batch_id, start_offsets, versions)
        return versions

    def segments(self) -> list[tuple[Offsets, dict[str, int]]]:
        """Each segment's start offsets and versions, in batch order (verification's oracle)."""
        return [(segment["from_offsets"], segment["versions"]) for segment in self.read()["segments"]]


def expected_rows(code: YourCode, valid: DataFrame, record: LookupVersions | None) -> DataFrame:
    """The oracle: the rows your code makes of the source's valid records, each segment of batches with the lookup
    versions it read (records no batch has read yet: the last segment's).

    >>> expected_rows(code, valid_records(parsed), LookupVersions.of(spec))  # doctest: +SKIP
    """
    if not code.spec.lookups:
        return code.apply(valid)
    segments = record.segments() if record is not None else []
    latest = code.latest_versions(valid.sparkSession)
    if not segments:
        return code.apply(valid, latest)
    parts = []
    for index, (starts, versions) in enumerate(segments):
        # The first segment also takes the records before it (read before the lookups were recorded), the last the
        # records after it; a lookup added since a segment was recorded is read at its newest version.
        rows = valid.where(_at_or_after(starts)) if index else valid
        if index + 1 < len(segments):
            rows = rows.where(~_at_or_after(segments[index + 1][0]))
        parts.append(code.apply(rows, {**latest, **versions}))
    combined = parts[0]
    for part in parts[1:]:
        combined = combined.unionByName(part)
    return combined


def _at_or_after(starts: Offsets) -> Any:
    """Records at or after ``starts`` (``{topic: {partition: offset}}``; a partition not named starts at 0)."""
    before = F.lit(False)
    for topic, partitions in starts.items():
        for partition, offset in partitions.items():
            before = before | (
                (F.col("_src_topic") == topic)
                & (F.col("_src_partition") == int(partition))
                & (F.col("_src_offset") < int(offset))
            )
    return ~before
