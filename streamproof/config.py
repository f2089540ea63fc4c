"""Pipeline file (TOML), validated with pydantic.

The file format is DESIGN.md's. Spark's own option names are accepted as aliases wherever Spark has
one (``startingOffsets`` for ``starting_offsets``), and any ``"kafka.*"`` key in ``[source]`` is passed
to Spark's Kafka connector verbatim (SASL/SSL settings, timeouts). ``${NAME}`` anywhere in a string is
replaced by the environment variable ``NAME`` (for secrets); a missing variable is an error.

Every problem is reported as one line naming the key, e.g.
``orders.toml: sink.mode: 'apend' is not one of append, merge``.

Example::

    >>> from streamproof.config import parse_pipeline
    >>> spec = parse_pipeline('''
    ... name = "orders"
    ... [source]
    ... kind = "kafka"
    ... topic = "orders"
    ... [transform]
    ... schema = "event_id STRING, order_id STRING"
    ... required = ["event_id"]
    ... [sink]
    ... kind = "delta"
    ... path = "/tmp/orders"
    ... ''')
    >>> spec.source.starting_offsets, spec.guarantee
    ('earliest', 'exactly-once')
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from streamproof.errors import ConfigError

Guarantee = Literal["exactly-once", "at-least-once", "at-most-once"]
GUARANTEES: tuple[str, ...] = ("exactly-once", "at-least-once", "at-most-once")

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DURATION = re.compile(r"^\s*\d+(\.\d+)?\s+(millisecond|second|minute|hour|day)s?\s*$", re.IGNORECASE)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# Larger fetches than the consumer's defaults (1 MB per partition, 500 records per poll): a 100k-record
# batch then takes a few round trips instead of dozens; measured +20% on the raw read of a topic.
# Any "kafka.*" key of the pipeline file overrides these.
KAFKA_CONSUMER_DEFAULTS = {
    "kafka.max.partition.fetch.bytes": str(16 << 20),
    "kafka.fetch.max.bytes": str(64 << 20),
    "kafka.max.poll.records": "20000",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _kafka_passthrough(data: Any) -> Any:
    """Move ``"kafka.*"`` keys (other than the bootstrap servers) into ``kafka_options``, verbatim as text.

    STYLE: PySpark option names; SASL/SSL settings and timeouts reach the Kafka client unchanged.
    """
    if not isinstance(data, dict):
        return data
    data = dict(data)
    passthrough = {
        key: data.pop(key)
        for key in list(data)
        if isinstance(key, str) and key.startswith("kafka.") and key != "kafka.bootstrap.servers"
    }
    for key, value in passthrough.items():
        if not isinstance(value, str | int | float | bool):
            raise ValueError(f"{key}: must be a string, number or boolean")
    data["kafka_options"] = {
        **data.get("kafka_options", {}),
        **{k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in passthrough.items()},
    }
    return data


class KafkaSource(_Strict):
    """``[source] kind = "kafka"``: Spark's Kafka connector; coordinates are topic, partition, offset."""

    kind: Literal["kafka"]
    bootstrap_servers: str = Field(
        "127.0.0.1:9092", validation_alias=AliasChoices("bootstrap_servers", "kafka.bootstrap.servers")
    )
    topic: str = Field(validation_alias=AliasChoices("topic", "subscribe"))
    starting_offsets: str = Field("earliest", validation_alias=AliasChoices("starting_offsets", "startingOffsets"))
    # Each batch pays a fixed ~1.5 s (two keyed Delta commits, each rebuilding the table's state to read its
    # transaction ids): `streamproof bench tuning` drained 2M events 1.8x faster in 500k batches than in
    # 100k ones (docs/performance.md), with the same peak memory (1.8 GB).
    max_offsets_per_trigger: int | None = Field(
        500_000, validation_alias=AliasChoices("max_offsets_per_trigger", "maxOffsetsPerTrigger"), gt=0
    )
    min_partitions: int | None = Field(None, validation_alias=AliasChoices("min_partitions", "minPartitions"), gt=0)
    fail_on_data_loss: bool = Field(True, validation_alias=AliasChoices("fail_on_data_loss", "failOnDataLoss"))
    kafka_options: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _collect_kafka_passthrough(cls, data: Any) -> Any:
        return _kafka_passthrough(data)

    @field_validator("starting_offsets")
    @classmethod
    def _starting_offsets(cls, value: str) -> str:
        if value in ("earliest", "latest") or value.lstrip().startswith("{"):
            return value
        raise ValueError(f"{value!r} is not earliest, latest or a JSON object of offsets per partition")

    def spark_options(self) -> dict[str, str]:
        """Options for ``spark.readStream.format("kafka")``, named as Spark names them."""
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "subscribe": self.topic,
            "startingOffsets": self.starting_offsets,
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            "includeHeaders": "false",
        }
        if self.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        if self.min_partitions is not None:
            options["minPartitions"] = str(self.min_partitions)
        options.update(KAFKA_CONSUMER_DEFAULTS)
        options.update(self.kafka_options)
        return options


class FilesSource(_Strict):
    """``[source] kind = "files"``: a folder of JSON-lines files, read by Spark's file source.

    Each line is a record; its coordinates are the file's path (``_src_topic``) and its line number from 1
    (``_src_offset``; ``_src_partition`` is 0). Spark logs the files of each batch in the checkpoint before
    the batch runs, so a replay reads the same files: the source half of exactly-once. Files are read whole
    (one task per file) as UTF-8 text; add new files, never append to one already read.
    """

    kind: Literal["files"]
    path: str = Field(min_length=1)
    pattern: str = Field("*.json", validation_alias=AliasChoices("pattern", "pathGlobFilter"))
    max_files_per_trigger: int | None = Field(
        None, validation_alias=AliasChoices("max_files_per_trigger", "maxFilesPerTrigger"), gt=0
    )


class DeltaSource(_Strict):
    """``[source] kind = "delta"``: a Delta table read as a stream (bronze -> silver, for one).

    Spark's Delta source logs the table version (and file index) of every batch in the checkpoint before the batch
    runs and replays exactly that range: the source half of exactly-once. A record is a row of the table (an
    append-only table; Delta stops the stream on an update or a delete), or with ``read_change_feed = true`` a
    change of the table's change data feed from ``starting_version`` (default 0): an ``insert`` or an
    ``update_postimage`` is a record, a ``delete`` goes to quarantine with reason ``deleted_upstream`` (visible,
    not applied), an ``update_preimage`` is not a record (the value before an update, delivered before).

    Coordinates: a table streamproof wrote carries each row's Kafka coordinates (``_src_topic``, ``_src_partition``,
    ``_src_offset``), and the records keep them, so a silver row traces back to its Kafka record. Another table
    names the columns that identify a row in ``coordinates``; ``_src_topic`` is then their values as JSON. A change
    other than an insert gets ``@v<version>:<change type>`` after its topic, so every change has its own.
    """

    kind: Literal["delta"]
    path: str = Field(min_length=1)
    read_change_feed: bool = Field(False, validation_alias=AliasChoices("read_change_feed", "readChangeFeed"))
    starting_version: int | None = Field(
        None, validation_alias=AliasChoices("starting_version", "startingVersion"), ge=0
    )
    coordinates: list[str] | None = Field(None, min_length=1)
    max_files_per_trigger: int | None = Field(
        None, validation_alias=AliasChoices("max_files_per_trigger", "maxFilesPerTrigger"), gt=0
    )

    @model_validator(mode="after")
    def _starting_version_needs_the_feed(self) -> DeltaSource:
        if self.starting_version is not None and not self.read_change_feed:
            raise ValueError(
                "starting_version: a table read without its change feed starts from its whole current content "
                "(what verification compares with); set read_change_feed = true to start from a version"
            )
        return self


SOURCE_KINDS = ("kafka", "files", "delta")
SourceSpec = Annotated[KafkaSource | FilesSource | DeltaSource, Field(discriminator="kind")]


class Dedup(_Strict):
    """``[transform] dedup``: keep the first record of each ``columns`` value, with state bounded by a watermark.

    ``watermark`` names the event-time column and ``delay`` how far behind the newest event time seen a
    record may be; Spark keeps a key in state until the watermark passes its event time plus ``delay``.
    ``method = "within-watermark"`` (default) is ``dropDuplicatesWithinWatermark(columns)``;
    ``"with-event-time"`` is ``dropDuplicates(columns + [watermark])`` (a resend with another event time
    is then a new record). Records older than the watermark (late) go to quarantine with reason ``late``
    (``late = "quarantine"``) or are counted as ``dropped_late`` by verification (``late = "drop"``).
    """

    columns: list[str] = Field(min_length=1)
    watermark: str = Field(min_length=1)
    delay: str = "1 hour"
    method: Literal["within-watermark", "with-event-time"] = "within-watermark"
    late: Literal["quarantine", "drop"] = "quarantine"

    @field_validator("delay")
    @classmethod
    def _delay(cls, value: str) -> str:
        return _duration(value)

    @property
    def key_columns(self) -> list[str]:
        """The columns that identify one event: what verification matches the sink on."""
        extra = [self.watermark] if self.method == "with-event-time" and self.watermark not in self.columns else []
        return [*self.columns, *extra]


class Aggregate(_Strict):
    """``[transform] aggregate``: tumbling event-time windows per ``by`` group, written once each, when closed.

    Output columns: ``window_start``, ``window_end``, the ``by`` columns, ``sum_<column>`` for each ``sum``
    column (``DECIMAL(38, 10)``: exact, so a recomputation compares equal) and ``events`` (the record count)
    when ``count``. Append mode: a window is written in the batch whose watermark passes its end, and never
    again. The watermark is dedup's when ``dedup`` is set; otherwise ``watermark`` and ``delay`` here.
    """

    window: str
    by: list[str] = Field(default_factory=list)
    sum: list[str] = Field(default_factory=list)
    count: bool = True
    watermark: str | None = None
    delay: str | None = None
    late: Literal["quarantine", "drop"] = "quarantine"  # dedup's setting when dedup is set

    @field_validator("window", "delay")
    @classmethod
    def _durations(cls, value: str | None) -> str | None:
        return None if value is None else _duration(value)

    @property
    def output_columns(self) -> list[str]:
        """The columns of a window row, in order."""
        return ["window_start", "window_end", *self.by, *(f"sum_{c}" for c in self.sum),
                *(["events"] if self.count else [])]  # fmt: skip


class Transform(_Strict):
    """``[transform]``: JSON parsing with a declared schema; invalid records go to quarantine."""

    format: Literal["json"] = "json"
    schema_: str = Field(validation_alias=AliasChoices("schema"), min_length=1)
    required: list[str] = Field(default_factory=list)
    quarantine: str | None = None
    dedup: Dedup | None = None
    aggregate: Aggregate | None = None
    # "add-columns": top-level fields the schema does not declare are carried into the Delta table as new STRING
    # columns (Delta schema merging); "none": they are ignored, as with any declared schema.
    schema_evolution: Literal["none", "add-columns"] = "none"
    # Derived columns of the sink rows: name -> Spark SQL expression over the record's fields and its _src_*
    # coordinates, e.g. amount_cents = "cast(amount * 100 as bigint)", ingested_at = "_src_timestamp".
    columns: dict[str, str] = Field(default_factory=dict)

    @field_validator("columns")
    @classmethod
    def _derived_columns(cls, value: dict[str, str]) -> dict[str, str]:
        for name, expression in value.items():
            if not _IDENTIFIER.match(name) or name.startswith("_"):
                raise ValueError(
                    f"columns: {name!r} is not a plain column name (letters, digits, '_'; not starting '_')"
                )
            if not expression.strip():
                raise ValueError(f"columns.{name}: empty expression")
        return value

    @property
    def watermark(self) -> tuple[str, str] | None:
        """The event-time column and delay of the pipeline's watermark, if it has one (dedup's, or aggregate's)."""
        if self.dedup is not None:
            return self.dedup.watermark, self.dedup.delay
        if self.aggregate is not None and self.aggregate.watermark is not None:
            return self.aggregate.watermark, self.aggregate.delay or "1 hour"
        return None

    @property
    def late(self) -> str:
        """Where late records go: ``quarantine`` (reason ``late``) or ``drop`` (counted by verify as dropped_late)."""
        if self.dedup is not None:
            return self.dedup.late
        return self.aggregate.late if self.aggregate is not None else "quarantine"

    @model_validator(mode="after")
    def _derived_columns_are_new(self) -> Transform:
        fields = {name.lower() for name in schema_field_names(self.schema_)}
        for name in self.columns:
            if name.lower() in fields:
                raise ValueError(
                    f"columns.{name}: {name!r} is already a field of schema: give the derived column another name"
                )
        if self.columns and self.aggregate is not None:
            raise ValueError("columns: derived columns are for record sinks; windows hold aggregates only")
        return self

    @model_validator(mode="after")
    def _aggregate_columns(self) -> Transform:
        if self.aggregate is None:
            return self
        names, aggregate = schema_field_names(self.schema_), self.aggregate
        for key in ("by", "sum"):
            for column in getattr(aggregate, key):
                if column not in names:
                    raise ValueError(f"aggregate.{key}: {column!r} is not a field of schema")
        if not aggregate.sum and not aggregate.count:
            raise ValueError("aggregate: nothing to compute: give sum = [columns] or count = true")
        if self.dedup is not None:
            if self.dedup.watermark not in self.required:
                raise ValueError(
                    f"dedup.watermark: {self.dedup.watermark!r} must be listed in transform.required when windows "
                    "follow dedup (a record without an event time belongs to no window)"
                )
            own = (aggregate.watermark, aggregate.delay)
            if own != (None, None) and own != (self.dedup.watermark, self.dedup.delay):
                raise ValueError(
                    "aggregate.watermark/delay: a pipeline has one watermark, dedup's here: leave them out of aggregate"
                )
            return self
        if aggregate.watermark is None:
            raise ValueError('aggregate.watermark: required, the event-time column windows follow (e.g. "event_time")')
        if aggregate.watermark not in self.required:
            # Spark's window() silently drops a row whose time is null: it must be quarantined instead.
            raise ValueError(
                f"aggregate.watermark: {aggregate.watermark!r} must be listed in transform.required (a record "
                "without an event time belongs to no window)"
            )
        if aggregate.watermark not in names:
            raise ValueError(f"aggregate.watermark: {aggregate.watermark!r} is not a field of schema")
        if schema_field_type(self.schema_, aggregate.watermark) not in ("TIMESTAMP", "TIMESTAMP_LTZ"):
            raise ValueError(f"aggregate.watermark: {aggregate.watermark!r} must be a TIMESTAMP field of schema")
        return self

    @model_validator(mode="after")
    def _columns_exist(self) -> Transform:
        names = schema_field_names(self.schema_)
        for column in self.required:
            if column not in names:
                raise ValueError(f"required: {column!r} is not a field of schema ({', '.join(names)})")
        if self.dedup is not None:
            for column in self.dedup.columns:
                if column not in names:
                    raise ValueError(f"dedup.columns: {column!r} is not a field of schema")
            if self.dedup.watermark not in names:
                raise ValueError(f"dedup.watermark: {self.dedup.watermark!r} is not a field of schema")
            if schema_field_type(self.schema_, self.dedup.watermark) not in ("TIMESTAMP", "TIMESTAMP_LTZ"):
                raise ValueError(
                    f"dedup.watermark: {self.dedup.watermark!r} must be a TIMESTAMP field of schema (the event time)"
                )
        return self


def _identifier(value: str) -> str:
    if not _IDENTIFIER.match(value) or len(value) > 63:
        raise ValueError(f"{value!r} is not a plain SQL identifier (letters, digits, '_'; at most 63)")
    return value


def _topic_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", value):
        raise ValueError(f"{value!r} is not a Kafka topic name (letters, digits, '.', '_', '-')")
    return value


class _SinkSpec(_Strict):
    """What every sink has: its kind, and a label that names it in reports (default: the kind)."""

    label: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

    @property
    def name(self) -> str:
        return self.label or str(self.kind)


class DeltaSinkSpec(_SinkSpec):
    """``[sink] kind = "delta"``: append (exactly-once through Delta's SetTransaction) or merge on a key."""

    kind: Literal["delta"]
    path: str = Field(min_length=1)
    mode: Literal["append", "merge"] = "append"
    key: str | None = None
    order_by: str = "event_time"  # merge: the latest record of a key by this column wins
    optimize_write: bool = False  # table property delta.autoOptimize.optimizeWrite: fewer, larger files
    auto_compact: bool = False  # table property delta.autoOptimize.autoCompact: compaction after commits

    @model_validator(mode="after")
    def _merge_needs_key(self) -> DeltaSinkSpec:
        if self.mode == "merge" and not self.key:
            raise ValueError("key: required when mode = 'merge' (the business key to upsert on)")
        return self


class PostgresSinkSpec(_SinkSpec):
    """``[sink] kind = "postgres"``: one transaction per batch partition with a ledger row (exactly-once).

    The password can only come from the environment (``password = "${PGPASSWORD}"``), never the file.
    """

    kind: Literal["postgres"]
    host: str = "127.0.0.1"
    port: int = Field(5432, gt=0, lt=65536)
    database: str = "streamproof"
    user: str = "streamproof"
    password_env: str | None = None  # the variable holding the password (``password = "${NAME}"`` in the file)
    db_schema: str = Field("public", validation_alias=AliasChoices("schema", "db_schema"))
    table: str
    mode: Literal["append", "upsert", "accumulate"] = "append"
    key: str | None = None  # upsert: the business key
    order_by: str = "event_time"  # upsert: the latest record of a key by this column wins
    by: str | None = None  # accumulate: the group column (e.g. customer_id)
    sum: list[str] = Field(default_factory=list)  # accumulate: columns added up per group
    ledger_table: str = "streamproof_ledger"

    @field_validator("db_schema", "table", "ledger_table", "key", "order_by", "by", "user")
    @classmethod
    def _sql_identifier(cls, value: str | None) -> str | None:
        # Names are interpolated into SQL (quoted too); only plain identifiers pass, so no injection.
        return value if value is None else _identifier(value)

    @field_validator("sum")
    @classmethod
    def _sum_identifiers(cls, value: list[str]) -> list[str]:
        return [_identifier(column) for column in value]

    @model_validator(mode="after")
    def _mode_needs_its_columns(self) -> PostgresSinkSpec:
        if self.mode == "upsert" and not self.key:
            raise ValueError("key: required when mode = 'upsert' (the business key)")
        if self.mode == "accumulate" and (not self.by or not self.sum):
            raise ValueError("by: mode = 'accumulate' needs by = <group column> and sum = [<columns>]")
        return self

    def password(self) -> str | None:
        """The password, read from its environment variable now (never stored in the spec)."""
        return os.environ.get(self.password_env) if self.password_env else None

    def conninfo(self, password: str | None = None) -> str:
        """libpq connection string (holds the password: never print it); by default the password is
        :meth:`password`, on executors the one the driver resolved."""
        from psycopg.conninfo import make_conninfo

        password = password if password is not None else self.password()
        return make_conninfo(
            host=self.host, port=self.port, dbname=self.database, user=self.user, password=password,
            connect_timeout=10, application_name="streamproof",
        )  # fmt: skip

    def redacted(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"


class KafkaSinkSpec(_SinkSpec):
    """``[sink] kind = "kafka"``: transactional producer per task, commit markers in a marker topic."""

    kind: Literal["kafka"]
    bootstrap_servers: str = Field(
        "127.0.0.1:9092", validation_alias=AliasChoices("bootstrap_servers", "kafka.bootstrap.servers")
    )
    topic: str
    marker_topic: str | None = None
    key: str | None = None  # column whose value becomes the Kafka record key
    kafka_options: dict[str, str] = Field(default_factory=dict)

    @field_validator("topic", "marker_topic")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        return value if value is None else _topic_name(value)

    @model_validator(mode="before")
    @classmethod
    def _collect_kafka_passthrough(cls, data: Any) -> Any:
        return _kafka_passthrough(data)

    def producer_options(self) -> dict[str, str]:
        """librdkafka settings from the ``"kafka.*"`` keys (prefix dropped)."""
        return {key.removeprefix("kafka."): value for key, value in self.kafka_options.items()}

    @property
    def markers(self) -> str:
        return self.marker_topic or f"{self.topic}.streamproof-markers"


class FilesSinkSpec(_SinkSpec):
    """``[sink] kind = "files"``: a Parquet folder written by Spark's file sink (``_spark_metadata`` log)."""

    kind: Literal["files"]
    path: str = Field(min_length=1)
    format: Literal["parquet"] = "parquet"


SinkSpec = Annotated[DeltaSinkSpec | PostgresSinkSpec | KafkaSinkSpec | FilesSinkSpec, Field(discriminator="kind")]
SINK_KINDS = ("delta", "postgres", "kafka", "files")


class Trigger(_Strict):
    processing_time: str | None = "2 seconds"
    available_now: bool = False

    @field_validator("processing_time")
    @classmethod
    def _processing_time(cls, value: str | None) -> str | None:
        return None if value is None else _duration(value)


class RetrySettings(_Strict):
    """``[retry]``: how long a Kafka broker or a database may be away before the pipeline gives up.

    Within ``max_outage`` a failed sink write is retried (it is keyed on the batch, so a retry is safe) and a
    query stopped by an unreachable source is restarted from its checkpoint; past it the pipeline stops with
    one line saying what was unreachable, and the next start resumes from the checkpoint.
    """

    max_outage: str = "2 minutes"
    backoff: str = "2 seconds"

    @field_validator("max_outage", "backoff")
    @classmethod
    def _durations(cls, value: str) -> str:
        return _duration(value)

    @property
    def max_outage_s(self) -> float:
        return duration_seconds(self.max_outage)

    @property
    def backoff_s(self) -> float:
        return duration_seconds(self.backoff)


def duration_seconds(text: str) -> float:
    """``"2 minutes"`` -> 120.0 (the duration forms the pipeline file accepts).

    >>> duration_seconds("1.5 seconds"), duration_seconds("2 minutes"), duration_seconds("1 hour")
    (1.5, 120.0, 3600.0)
    """
    number, unit = text.split()
    scale = {"millisecond": 0.001, "second": 1, "minute": 60, "hour": 3600, "day": 86400}[unit.lower().rstrip("s")]
    return float(number) * scale


class MetricsSettings(_Strict):
    """``[metrics]``: a Prometheus endpoint while the pipeline runs (off without a port)."""

    port: int | None = Field(None, gt=0, lt=65536)
    host: str = "127.0.0.1"


class SparkSettings(_Strict):
    """``[spark]``: where the pipeline runs. Defaults fit a 2-core laptop."""

    master: str = "local[2]"
    driver_memory: str = "2g"
    shuffle_partitions: int = Field(2, gt=0)
    # "quick-start" compiles with C1 only: a JVM that lives seconds to minutes (a crash harness restarting
    # it, a test) spends far less CPU compiling; a long-running pipeline reaches more rows/s with "tiered".
    # The environment variable STREAMPROOF_JIT overrides it (the harness and the test suite set it).
    jit: Literal["tiered", "quick-start"] = "tiered"
    # The driver JVM's garbage collector. A micro-batch allocates a burst of short-lived objects (fetched
    # records, parsed rows, the cached batch) and then drops them all: the throughput collector suits that
    # better than G1, the JVM's default. `streamproof bench tuning` drained 2M events 12% faster with it
    # (two rounds each; 8% in an earlier comparison) at a 28% lower peak memory (docs/performance.md).
    gc: Literal["parallel", "g1"] = "parallel"
    conf: dict[str, str] = Field(default_factory=dict)


class PipelineSpec(_Strict):
    """A whole pipeline file: one ``[sink]``, or several ``[[sinks]]`` fed from the same stream (fan-out)."""

    name: str = Field(min_length=1)
    guarantee: Guarantee = "exactly-once"
    checkpoint: str | None = None
    source: SourceSpec
    transform: Transform
    sink: SinkSpec | None = None
    sinks: list[SinkSpec] = Field(default_factory=list)
    trigger: Trigger = Trigger()
    spark: SparkSettings = SparkSettings()
    metrics: MetricsSettings = MetricsSettings()
    retry: RetrySettings = RetrySettings()
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _source_name: str = PrivateAttr(default="PIPELINE.toml")  # the file it was read from, for hints
    # Values that came from ${NAME} references, mapped back to the reference: a dumped file keeps the
    # reference, never the secret it resolved to.
    _env_references: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_cannot_honour_the_guarantee(cls, data: Any) -> Any:
        # Runs before field validation so that "socket under exactly-once" explains itself, instead of
        # reading as a mere unknown kind.
        from streamproof.guarantees import KNOWN_SINKS, KNOWN_SOURCES, refusal

        if not isinstance(data, dict):
            return data
        source, guarantee = data.get("source"), data.get("guarantee", "exactly-once")
        sinks = [data["sink"]] if isinstance(data.get("sink"), dict) else []
        sinks += [item for item in data.get("sinks") or [] if isinstance(item, dict)]
        if isinstance(source, dict) and isinstance(guarantee, str):
            for sink in sinks:
                reason = refusal(guarantee, str(source.get("kind")), str(sink.get("kind")))
                if reason and source.get("kind") in KNOWN_SOURCES and sink.get("kind") in KNOWN_SINKS:
                    raise ValueError(reason)
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
            raise ValueError(f"{value!r} must be letters, digits, '_', '.' or '-' (it names files and ids)")
        return value

    @model_validator(mode="after")
    def _sinks_are_consistent(self) -> PipelineSpec:
        if (self.sink is None) == (not self.sinks):
            raise ValueError("sink: give exactly one of [sink] (one destination) or [[sinks]] (several)")
        labels = [sink.name for sink in self.sink_specs]
        if len(set(labels)) != len(labels):
            raise ValueError(f"sinks: two sinks are named {labels!r}: give each a distinct label")
        if self.guarantee == "exactly-once":
            for name, expression in self.transform.columns.items():
                if reason := replay_unsafe(expression):
                    raise ValueError(
                        f"transform.columns.{name}: {reason}, so a batch replayed after a crash would write other "
                        "values and exactly-once cannot hold; derive it from the record instead, e.g. "
                        f'{name} = "_src_timestamp" (Kafka\'s record timestamp)'
                    )
        if self.guarantee == "at-most-once" and self.transform.watermark is not None:
            raise ValueError(
                "guarantee: at-most-once restarts without Spark's checkpoint, state included, so dedup would forget "
                "the ids it saw and let resends through (duplicates at-most-once promises never to write); use "
                "exactly-once or at-least-once with dedup and windows"
            )
        if isinstance(self.source, FilesSource | DeltaSource):
            kind = self.source.kind
            if self.guarantee == "at-most-once":
                raise ValueError(
                    f"guarantee: at-most-once keeps its own Kafka offsets to skip a batch; a {kind} source supports "
                    "exactly-once and at-least-once"
                )
            for sink in self.sink_specs:
                if isinstance(sink, PostgresSinkSpec | KafkaSinkSpec):
                    raise ValueError(
                        f"source.kind: a {kind} source feeds delta and files sinks; the {sink.kind} sink {sink.name!r} "
                        "keys its writes on Kafka partitions"
                    )
            if self.transform.watermark is not None:
                raise ValueError(
                    "transform: dedup and windows need a kafka source (late records are recomputed from Kafka offset "
                    f"ranges); a {kind} source carries records as they are"
                )
        where = "sink" if self.sink is not None else "sinks"
        # Schema merging and window rows both need a Delta table in append mode.
        other = next((sink for sink in self.sink_specs
                      if not (isinstance(sink, DeltaSinkSpec) and sink.mode == "append")), None)  # fmt: skip
        other_text = "" if other is None else other.kind + (
            f" in {other.mode} mode" if isinstance(other, DeltaSinkSpec) else "")  # fmt: skip
        if self.transform.schema_evolution == "add-columns":
            if self.transform.aggregate is not None:
                raise ValueError("transform.schema_evolution: 'add-columns' carries record fields; windows have none")
            if other is not None:
                raise ValueError(
                    f"transform.schema_evolution: 'add-columns' needs Delta tables in append mode (schema merging), "
                    f"and {where} {other.name!r} is {other_text}: remove schema_evolution or that sink"
                )
        if self.transform.aggregate is not None:
            if other is not None:
                raise ValueError(
                    f"{where}.kind: transform.aggregate writes window rows to a Delta table in append mode "
                    f'(kind = "delta", mode = "append"), not to {other_text}'
                )
            return self
        fields = [*schema_field_names(self.transform.schema_), "_src_topic", "_src_partition", "_src_offset"]
        for sink in self.sink_specs:
            for column in _sink_columns(sink):
                if column not in fields:
                    raise ValueError(f"{where}.{_column_key(sink, column)}: {column!r} is not a field of the schema")
            # A record without its key or group cannot be upserted or totalled: it must be quarantined instead.
            for name in ("key", "by"):
                column = getattr(sink, name, None)
                stateful = not isinstance(sink, KafkaSinkSpec) and _sink_columns(sink)
                if column and stateful and column not in self.transform.required:
                    raise ValueError(
                        f"{where}.{name}: {column!r} must be listed in transform.required (a record without it "
                        "has nowhere to go but quarantine)"
                    )
        return self

    @property
    def sink_specs(self) -> list[DeltaSinkSpec | PostgresSinkSpec | KafkaSinkSpec | FilesSinkSpec]:
        """Every sink of the pipeline, in file order."""
        return [self.sink] if self.sink is not None else list(self.sinks)

    def resolve_path(self, path: str) -> Path:
        """A path of the file, relative to the folder the pipeline file is in (URIs pass unchanged)."""
        if "://" in path:
            return Path(path)
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else (self._base_dir / candidate).resolve()

    @property
    def checkpoint_dir(self) -> Path:
        return self.resolve_path(self.checkpoint or f".streamproof/checkpoints/{self.name}")

    @property
    def quarantine_path(self) -> Path:
        if self.transform.quarantine:
            return self.resolve_path(self.transform.quarantine)
        first = self.sink_specs[0]
        if isinstance(first, DeltaSinkSpec | FilesSinkSpec):
            return self.resolve_path(f"{first.path}_quarantine")
        return self.resolve_path(f".streamproof/tables/{self.name}_quarantine")


def _sink_columns(sink: DeltaSinkSpec | PostgresSinkSpec | KafkaSinkSpec | FilesSinkSpec) -> list[str]:
    """Schema columns a sink's settings name (checked against the transform's schema)."""
    if isinstance(sink, DeltaSinkSpec) and sink.mode == "merge":
        return [column for column in (sink.key, sink.order_by) if column]
    if isinstance(sink, PostgresSinkSpec) and sink.mode == "upsert":
        return [column for column in (sink.key, sink.order_by) if column]
    if isinstance(sink, PostgresSinkSpec) and sink.mode == "accumulate":
        return [column for column in (sink.by, *sink.sum) if column]
    if isinstance(sink, KafkaSinkSpec) and sink.key:
        return [sink.key]
    return []


def _column_key(sink: DeltaSinkSpec | PostgresSinkSpec | KafkaSinkSpec | FilesSinkSpec, column: str) -> str:
    for key in ("key", "order_by", "by"):
        if getattr(sink, key, None) == column:
            return key
    return "sum"


# Functions whose value depends on when or where a batch runs. Catalyst calls the clock ones deterministic (they
# are fixed per query run), yet a replay after a crash runs at another time: caught by name. Random and
# id-generating functions are also caught at start-up from the analysed plan (pipeline.check_derived_columns).
_REPLAY_UNSAFE = re.compile(
    r"\b(current_timestamp|current_date|current_time|now|localtimestamp|curdate|sysdate|rand|randn|random|uuid|"
    r"shuffle|monotonically_increasing_id|spark_partition_id|input_file_name|input_file_block_start|"
    r"input_file_block_length)\s*\(|\bunix_timestamp\s*\(\s*\)|\bcurrent_(timestamp|date|time)\b(?!\s*\()",
    re.IGNORECASE,
)


def replay_unsafe(expression: str) -> str | None:
    """Why a SQL expression gives another value when its batch is replayed, or None when nothing is known.

    >>> replay_unsafe("cast(amount * 100 as bigint)") is None
    True
    >>> replay_unsafe("date_format(current_timestamp(), 'yyyy')")
    'current_timestamp() gives the time the batch runs'
    """
    match = _REPLAY_UNSAFE.search(expression)
    if match is None:
        return None
    function = match.group(1) or f"current_{match.group(2)}" if match.group(1) or match.group(2) else "unix_timestamp"
    clock = function.lower() in ("current_timestamp", "current_date", "current_time", "now", "localtimestamp",
                                 "curdate", "sysdate", "unix_timestamp")  # fmt: skip
    return f"{function}() gives {'the time the batch runs' if clock else 'another value on every run'}"


def schema_field_type(schema_ddl: str, name: str) -> str | None:
    """The declared type of a top-level field, upper-case, or None.

    >>> schema_field_type("event_id STRING, event_time timestamp", "event_time")
    'TIMESTAMP'
    """
    for field in _top_level_fields(schema_ddl):
        parts = field.split(None, 1)
        if parts and parts[0].strip("`") == name:
            return parts[1].strip().upper() if len(parts) > 1 else None
    return None


def _top_level_fields(schema_ddl: str) -> list[str]:
    fields, depth, current = [], 0, ""
    for char in schema_ddl + ",":
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        if char == "," and depth == 0:
            fields.append(current.strip())
            current = ""
        else:
            current += char
    return fields


def schema_field_names(schema_ddl: str) -> list[str]:
    """Top-level field names of a Spark DDL schema string, without starting Spark.

    >>> schema_field_names("event_id STRING, amount DECIMAL(10, 2), tags ARRAY<STRING>")
    ['event_id', 'amount', 'tags']
    """
    if schema_ddl.count("<") + schema_ddl.count("(") != schema_ddl.count(">") + schema_ddl.count(")"):
        raise ValueError(f"schema: unbalanced brackets in {schema_ddl!r}")
    names = []
    for field in _top_level_fields(schema_ddl):
        if not field:
            raise ValueError(f"schema: empty field in {schema_ddl!r}")
        parts = field.split(None, 1)
        if len(parts) < 2:
            raise ValueError(f"schema: {field!r} needs a name and a type, e.g. 'amount DOUBLE'")
        name = parts[0].strip("`")
        if not _IDENTIFIER.match(name):
            raise ValueError(f"schema: {name!r} is not a valid column name")
        names.append(name)
    return names


def _duration(value: str) -> str:
    if not _DURATION.match(value):
        raise ValueError(f"{value!r} is not a duration like '2 seconds' or '1 hour'")
    return value.strip()


def _interpolate_env(value: Any, where: str, references: dict[str, str]) -> Any:
    """Replace ``${NAME}`` by the variable's value; ``references`` maps each value so made back to its text."""
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(f"{where}: environment variable {name} is not set (referenced as ${{{name}}})")
            return os.environ[name]

        resolved = _ENV_REFERENCE.sub(substitute, value)
        if resolved != value:
            references[resolved] = value
        return resolved
    if isinstance(value, dict):
        return {
            key: _interpolate_env(item, f"{where}.{key}" if where else key, references) for key, item in value.items()
        }
    if isinstance(value, list):
        return [_interpolate_env(item, f"{where}[{index}]", references) for index, item in enumerate(value)]
    return value


def _location(parts: tuple[int | str, ...]) -> str:
    """``("sinks", 1, "postgres", "table")`` -> ``sinks[1].table``: validator names and union tags dropped."""
    text = ""
    for index, part in enumerate(parts):
        if str(part).startswith("function-after"):
            continue
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in SINK_KINDS and index > 0 and (parts[index - 1] == "sink" or isinstance(parts[index - 1], int)):
            continue  # the discriminator of the sink union, not a key of the file
        elif part in SOURCE_KINDS and index > 0 and parts[index - 1] == "source":
            continue  # the discriminator of the source union
        else:
            text += f".{part}" if text else str(part)
    return text


def _first_error_line(error: ValidationError) -> str:
    first = error.errors()[0]
    location = _location(first["loc"])
    kind, message = first["type"], first["msg"]
    given = first.get("input")
    kinds = SOURCE_KINDS if location == "source" else SINK_KINDS
    if kind == "union_tag_invalid":
        location = f"{location}.kind"
        message = f"{first.get('ctx', {}).get('tag')!r} is not one of {', '.join(kinds)}"
    elif kind == "union_tag_not_found":
        location, message = f"{location}.kind", f"missing (one of {', '.join(kinds)})"
    elif kind == "literal_error":
        allowed = first.get("ctx", {}).get("expected", "")
        allowed = allowed.replace("'", "").replace(" or ", ", ")
        message = f"{given!r} is not one of {allowed}"
    elif kind == "extra_forbidden":
        message = "unknown key (check its spelling against DESIGN.md's pipeline file)"
    elif kind == "missing":
        message = "missing (required)"
    elif kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif isinstance(given, str | int | float | bool):
        message = f"{given!r}: {message[0].lower()}{message[1:]}"
    nested = re.match(r"^([a-z_.]+): (.*)$", message)
    if nested and kind == "value_error":  # a model-level check names its own key: "required: ..."
        location, message = ".".join(p for p in (location, nested.group(1)) if p), nested.group(2)
    return f"{location}: {message}" if location else message


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def dump_pipeline(spec: PipelineSpec) -> str:
    """The pipeline as TOML text that :func:`parse_pipeline` reads back to an equal spec.

    Paths are written as resolved absolute paths, so the file works from any directory. A value that came
    from ``${NAME}`` is written as ``${NAME}`` again, and a password as its variable (``password_env``): the
    text never holds a secret.
    """
    references = spec._env_references
    data = spec.model_dump(exclude_none=True, exclude={"sink", "sinks"})
    data["checkpoint"] = str(spec.checkpoint_dir)
    data["transform"]["schema"] = data["transform"].pop("schema_")
    data["transform"]["quarantine"] = str(spec.quarantine_path)
    data["source"].update(data["source"].pop("kafka_options", {}))
    lines = _toml_pairs({key: data[key] for key in ("name", "guarantee", "checkpoint")}, references)
    for table in ("source", "transform", "trigger", "spark", "metrics", "retry"):
        lines += ["", f"[{table}]", *_toml_pairs(data[table], references)]
    for sink in spec.sink_specs:
        sink_data = sink.model_dump(exclude_none=True)
        if "path" in sink_data:
            sink_data["path"] = str(spec.resolve_path(sink_data["path"]))
        sink_data.update(sink_data.pop("kafka_options", {}))
        lines += ["", "[sink]" if spec.sink is not None else "[[sinks]]", *_toml_pairs(sink_data, references)]
    return "\n".join(lines) + "\n"


def _toml_pairs(table: dict[str, Any], references: dict[str, str]) -> list[str]:
    return [
        f"{_toml_key(key)} = {_toml_value(references.get(value, value) if isinstance(value, str) else value)}"
        for key, value in table.items()
    ]


_PASSWORD_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def _password_from_environment_only(raw: dict[str, Any]) -> None:
    """Turn ``password = "${NAME}"`` into ``password_env = "NAME"``; refuse a literal password.

    The spec then never holds the secret itself, so no log line, report or dumped file can leak it; the
    sink reads the variable when it connects.
    """
    tables = [("sink", raw.get("sink"))] + [(f"sinks[{i}]", t) for i, t in enumerate(raw.get("sinks") or [])]
    for where, table in tables:
        if not isinstance(table, dict) or "password" not in table:
            continue
        reference = _PASSWORD_REFERENCE.match(str(table["password"]))
        if reference is None:
            raise ConfigError(
                f"{where}.password: passwords are read from the environment only: write password = "
                '"${PGPASSWORD}" and export PGPASSWORD'
            )
        if reference.group(1) not in os.environ:
            raise ConfigError(f"{where}.password: environment variable {reference.group(1)} is not set")
        del table["password"]
        table["password_env"] = reference.group(1)


def parse_pipeline(text: str, *, source_name: str = "<pipeline>", base_dir: Path | None = None) -> PipelineSpec:
    """Parse and validate pipeline TOML text; raise :class:`ConfigError` with one line on any problem."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source_name}: not valid TOML: {error}") from None
    try:
        _password_from_environment_only(raw)
        references: dict[str, str] = {}
        raw = _interpolate_env(raw, "", references)
    except ConfigError as error:
        raise ConfigError(f"{source_name}: {error}") from None
    try:
        spec = PipelineSpec.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(f"{source_name}: {_first_error_line(error)}") from None
    spec._base_dir = base_dir or Path.cwd()
    spec._source_name = source_name
    spec._env_references = references
    return spec


def load_pipeline(path: str | Path) -> PipelineSpec:
    """Read a pipeline file; relative paths inside it are relative to the current directory.

    >>> load_pipeline("examples/orders_to_delta.toml").sink.kind  # doctest: +SKIP
    'delta'
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such pipeline file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{file}: cannot read it: {error}") from None
    return parse_pipeline(text, source_name=str(file), base_dir=Path.cwd())
