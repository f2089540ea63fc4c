"""``[transform]``: how a record is parsed and judged (schema, required fields), deduplicated, aggregated
in windows, and what derived columns it gets.

Example::

    >>> transform = Transform.model_validate({"schema": "event_id STRING, event_time TIMESTAMP",
    ...                                        "required": ["event_id"]})
    >>> transform.watermark is None, transform.late
    (True, 'quarantine')
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from streamproof.config.fields import IDENTIFIER, Strict, duration, schema_field_names, schema_field_type


class Dedup(Strict):
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
        return duration(value)

    @property
    def key_columns(self) -> list[str]:
        """The columns that identify one event: what verification matches the sink on."""
        extra = [self.watermark] if self.method == "with-event-time" and self.watermark not in self.columns else []
        return [*self.columns, *extra]


class Aggregate(Strict):
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
        return None if value is None else duration(value)

    @property
    def output_columns(self) -> list[str]:
        """The columns of a window row, in order."""
        return [
            "window_start",
            "window_end",
            *self.by,
            *(f"sum_{c}" for c in self.sum),
            *(["events"] if self.count else []),
        ]


class Transform(Strict):
    """``[transform]``: JSON parsing with a declared schema; invalid records go to quarantine."""

    format: Literal["json", "avro"] = "json"
    # format = "avro": the writer schema, from a file (records are bare Avro datums) or from a Confluent-compatible
    # registry (records in Confluent's wire format; subject default "<topic>-value"). See streamproof/transform/avro.py.
    avro_schema: str | None = None
    schema_registry: str | None = None
    schema_subject: str | None = None
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
    # Your own code (docs/your-code.md): a function "package.module:function" (DataFrame -> DataFrame), or one SQL
    # query over the view `records`, applied to each batch's valid records before the sinks.
    python: str | None = None
    sql: str | None = None

    @field_validator("python")
    @classmethod
    def _function_name(cls, value: str | None) -> str | None:
        if value is not None and not FUNCTION_NAME.fullmatch(value):
            raise ValueError(
                f'{value!r} is not "package.module:function" (a module importable by name, a colon, '
                "a function defined at its top level)"
            )
        return value

    @field_validator("sql")
    @classmethod
    def _one_query(cls, value: str | None) -> str | None:
        if value is not None and not re.search(r"\bfrom\s+records\b", value, re.IGNORECASE):
            raise ValueError(
                'the query reads the batch\'s valid records from the view `records`: "SELECT ... FROM records ..."'
            )
        return value

    @property
    def user_code(self) -> str | None:
        """How the pipeline file names the user's transform (``python = ...`` or ``sql = ...``), or None."""
        if self.python is not None:
            return f"transform.python ({self.python})"
        return "transform.sql" if self.sql is not None else None

    @field_validator("columns")
    @classmethod
    def _derived_columns(cls, value: dict[str, str]) -> dict[str, str]:
        for name, expression in value.items():
            if not IDENTIFIER.match(name) or name.startswith("_"):
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
    def _avro_needs_its_schema(self) -> Transform:
        given = [key for key in ("avro_schema", "schema_registry", "schema_subject") if getattr(self, key)]
        if self.format != "avro":
            if given:
                raise ValueError(f'{given[0]}: only for format = "avro" (format is {self.format!r})')
            return self
        if (self.avro_schema is None) == (self.schema_registry is None):
            raise ValueError(
                'format: "avro" needs exactly one of avro_schema = "<file>.avsc" (bare Avro records) and '
                'schema_registry = "http://..." (Confluent\'s wire format)'
            )
        if self.schema_subject and not self.schema_registry:
            raise ValueError("schema_subject: only with schema_registry")
        if self.schema_registry and not re.match(r"^https?://[^\s/]+", self.schema_registry):
            raise ValueError(f"schema_registry: {self.schema_registry!r} is not an http(s) URL")
        if self.schema_evolution != "none":
            raise ValueError('schema_evolution: "add-columns" reads undeclared JSON fields; Avro records have none')
        return self

    @model_validator(mode="after")
    def _one_kind_of_user_code(self) -> Transform:
        if self.python is not None and self.sql is not None:
            raise ValueError("python, sql: give one of them (a SQL query can call a function registered as a UDF)")
        if self.user_code is not None and self.schema_evolution != "none":
            raise ValueError(
                f'{self.user_code.split(" ")[0]}: not with schema_evolution = "add-columns" (the columns '
                "a batch adds depend on the batch); declare the fields your code uses in schema"
            )
        if self.user_code is not None and self.watermark is not None:
            raise ValueError(
                f"{self.user_code.split(' ')[0]}: not yet with dedup or windows (a function before stateful "
                "operators runs inside Spark's streaming plan, where lookups cannot be pinned): deduplicate or "
                "aggregate in a pipeline reading this one's Delta table"
            )
        return self

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


FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


# Functions whose value depends on when or where a batch runs. Catalyst calls the clock ones deterministic (they
# are fixed per query run), yet a replay after a crash runs at another time: caught by name. Random and
# id-generating functions are also caught at start-up from the analysed plan (transform.check_derived_columns).
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
    clock = function.lower() in (
        "current_timestamp",
        "current_date",
        "current_time",
        "now",
        "localtimestamp",
        "curdate",
        "sysdate",
        "unix_timestamp",
    )
    return f"{function}() gives {'the time the batch runs' if clock else 'another value on every run'}"
