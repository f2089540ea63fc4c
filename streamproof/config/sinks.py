"""``[sink]`` / ``[[sinks]]``: where the valid records go (Delta, PostgreSQL, Kafka, a Parquet folder).

Example::

    >>> DeltaSinkSpec(kind="delta", path="tables/orders", mode="merge", key="order_id").schema_columns()
    [('key', 'order_id'), ('order_by', 'event_time')]
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from streamproof.config.fields import Strict, kafka_passthrough, sql_identifier, topic_name


class SinkSpecBase(Strict):
    """What every sink has: its kind, and a label that names it in reports (default: the kind)."""

    kind: str  # each kind's model narrows it to its own name (the discriminator of the sink union)
    label: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

    @property
    def name(self) -> str:
        return self.label or str(self.kind)

    def schema_columns(self) -> list[tuple[str, str]]:
        """The schema columns the sink's settings name, each with its key (checked against the schema)."""
        return []

    @property
    def folder(self) -> str | None:
        """The path of the folder the sink writes its files in (Delta, Parquet); None for a database or a topic."""
        return None


class DeltaSinkSpec(SinkSpecBase):
    """``[sink] kind = "delta"``: append (exactly-once through Delta's SetTransaction) or merge on a key."""

    kind: Literal["delta"]
    path: str = Field(min_length=1)
    mode: Literal["append", "merge"] = "append"
    key: str | None = None
    order_by: str = "event_time"  # merge: the latest record of a key by this column wins
    optimize_write: bool = False  # table property delta.autoOptimize.optimizeWrite: fewer, larger files
    auto_compact: bool = False  # table property delta.autoOptimize.autoCompact: compaction after commits
    # The table's partition columns (record fields or [transform] columns), set when the table is created. Under
    # merge, a key's partition values must never change (derive them from the key, or from a field fixed per key):
    # the MERGE looks for a key only in the partitions of the batch.
    partition_by: list[str] = Field(default_factory=list)
    zorder_by: list[str] = Field(default_factory=list)  # maintain --optimize: Z-order the files of each partition

    @field_validator("partition_by", "zorder_by")
    @classmethod
    def _distinct_identifiers(cls, value: list[str]) -> list[str]:
        for column in value:
            sql_identifier(column)
        if len({column.lower() for column in value}) != len(value):
            raise ValueError(f"{value}: a column is listed twice")
        return value

    @model_validator(mode="after")
    def _merge_needs_key(self) -> DeltaSinkSpec:
        if self.mode == "merge" and not self.key:
            raise ValueError("key: required when mode = 'merge' (the business key to upsert on)")
        if overlap := {c.lower() for c in self.zorder_by} & {c.lower() for c in self.partition_by}:
            raise ValueError(
                f"zorder_by: {sorted(overlap)} already partition the table; Z-order by columns within a partition"
            )
        return self

    def schema_columns(self) -> list[tuple[str, str]]:
        keyed = [("key", str(self.key)), ("order_by", self.order_by)] if self.mode == "merge" else []
        laid_out = [*(("partition_by", c) for c in self.partition_by), *(("zorder_by", c) for c in self.zorder_by)]
        return keyed + laid_out

    @property
    def folder(self) -> str:
        return self.path


class PostgresSinkSpec(SinkSpecBase):
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
        return value if value is None else sql_identifier(value)

    @field_validator("sum")
    @classmethod
    def _sum_identifiers(cls, value: list[str]) -> list[str]:
        return [sql_identifier(column) for column in value]

    @model_validator(mode="after")
    def _mode_needs_its_columns(self) -> PostgresSinkSpec:
        if self.mode == "upsert" and not self.key:
            raise ValueError("key: required when mode = 'upsert' (the business key)")
        if self.mode == "accumulate" and (not self.by or not self.sum):
            raise ValueError("by: mode = 'accumulate' needs by = <group column> and sum = [<columns>]")
        return self

    def schema_columns(self) -> list[tuple[str, str]]:
        if self.mode == "upsert":
            return [("key", str(self.key)), ("order_by", self.order_by)]
        if self.mode == "accumulate":
            return [("by", str(self.by)), *(("sum", column) for column in self.sum)]
        return []

    def password(self) -> str | None:
        """The password, read from its environment variable now (never stored in the spec)."""
        return os.environ.get(self.password_env) if self.password_env else None

    def conninfo(self, password: str | None = None) -> str:
        """libpq connection string (holds the password: never print it); by default the password is
        :meth:`password`, on executors the one the driver resolved."""
        from psycopg.conninfo import make_conninfo  # psycopg only where PostgreSQL is used: 0.18 s of every start

        password = password if password is not None else self.password()
        return make_conninfo(
            host=self.host,
            port=self.port,
            dbname=self.database,
            user=self.user,
            password=password,
            connect_timeout=10,
            application_name="streamproof",
        )

    def redacted(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"


class KafkaSinkSpec(SinkSpecBase):
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
        return value if value is None else topic_name(value)

    @model_validator(mode="before")
    @classmethod
    def _collect_kafka_passthrough(cls, data: Any) -> Any:
        return kafka_passthrough(data)

    def schema_columns(self) -> list[tuple[str, str]]:
        return [("key", self.key)] if self.key else []

    def producer_options(self) -> dict[str, str]:
        """librdkafka settings from the ``"kafka.*"`` keys (prefix dropped)."""
        return {key.removeprefix("kafka."): value for key, value in self.kafka_options.items()}

    @property
    def markers(self) -> str:
        return self.marker_topic or f"{self.topic}.streamproof-markers"


class FilesSinkSpec(SinkSpecBase):
    """``[sink] kind = "files"``: a Parquet folder written by Spark's file sink (``_spark_metadata`` log)."""

    kind: Literal["files"]
    path: str = Field(min_length=1)
    format: Literal["parquet"] = "parquet"

    @property
    def folder(self) -> str:
        return self.path


class PythonSinkSpec(SinkSpecBase):
    """``[sink] kind = "python"``: your own sink, a function that writes each batch (``write``), and one that reads
    back what the sink holds, with lineage, for verification (``read``). streamproof hands it every batch, replays
    included, and claims nothing for it: ``prove --matrix`` tells which guarantee it gives (docs/your-code.md).

    >>> PythonSinkSpec(kind="python", write="shop.sinks:naive_write", read="shop.sinks:read_lines").name
    'python'
    """

    kind: Literal["python"]
    write: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
    read: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
    # Keyword arguments of write (a table name, a path, a connection's settings) and read's second argument: one
    # module serves several sinks. --matrix gives each cell its own copy of what the options name: a "table" or
    # "*_table" gets a suffix, a "path" or "*_path" a folder of the cell's.
    options: dict[str, Any] = Field(default_factory=dict)
    # What verification compares the sink with: every valid record (default), or with ``key`` one row per key
    # holding its latest record by ``order_by`` (an upsert or MERGE written by your code).
    key: str | None = None
    order_by: str = "event_time"

    def schema_columns(self) -> list[tuple[str, str]]:
        return [("key", self.key), ("order_by", self.order_by)] if self.key else []


SinkSpec = Annotated[
    DeltaSinkSpec | PostgresSinkSpec | KafkaSinkSpec | FilesSinkSpec | PythonSinkSpec, Field(discriminator="kind")
]
SINK_KINDS = ("delta", "postgres", "kafka", "files", "python")
AnySinkSpec = DeltaSinkSpec | PostgresSinkSpec | KafkaSinkSpec | FilesSinkSpec | PythonSinkSpec
