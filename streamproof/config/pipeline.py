"""A whole pipeline file: its sections, and the rules that tie them together.

Each rule is one validator, run in the order written; the first that fails names its key in one line
(``sink.key: 'order_id' must be listed in transform.required ...``).

Example::

    >>> spec = PipelineSpec.model_validate({
    ...     "name": "orders", "source": {"kind": "kafka", "topic": "orders"},
    ...     "transform": {"schema": "event_id STRING"},
    ...     "sinks": [{"kind": "delta", "path": "/tmp/orders"}, {"kind": "kafka", "topic": "orders-out"}]})
    >>> [sink.name for sink in spec.sink_specs], str(spec.quarantine_path)
    (['delta', 'kafka'], '/tmp/orders_quarantine')
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

from streamproof.config.fields import Strict, schema_field_names
from streamproof.config.settings import MetricsSettings, RetrySettings, SparkSettings, Trigger
from streamproof.config.sinks import (
    AnySinkSpec,
    DeltaSinkSpec,
    FilesSinkSpec,
    KafkaSinkSpec,
    PostgresSinkSpec,
    SinkSpec,
)
from streamproof.config.sources import DeltaSource, FilesSource, KafkaSource, Lookup, SourceSpec
from streamproof.config.transform import Transform, replay_unsafe
from streamproof.errors import ConfigError
from streamproof.guarantees import (
    KNOWN_SINKS,
    KNOWN_SOURCES,
    S3_CONF,
    Guarantee,
    Wiring,
    refusal,
    storage_refusal,
    wiring_for,
)
from streamproof.storage.location import Location


class PipelineSpec(Strict):
    """A whole pipeline file: one ``[sink]``, or several ``[[sinks]]`` fed from the same stream (fan-out).

    Relative paths in it (checkpoint, tables, folders) are relative to the directory the command runs in
    (:func:`streamproof.config.load_pipeline`); a URI (``hdfs://...``) is kept as it is.
    """

    name: str = Field(min_length=1)
    guarantee: Guarantee = "exactly-once"
    checkpoint: str | None = None
    source: SourceSpec
    transform: Transform
    sink: SinkSpec | None = None
    sinks: list[SinkSpec] = Field(default_factory=list)
    lookups: list[Lookup] = Field(default_factory=list)
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
    def _one_form_of_sinks_with_distinct_labels(self) -> PipelineSpec:
        if (self.sink is None) == (not self.sinks):
            raise ValueError("sink: give exactly one of [sink] (one destination) or [[sinks]] (several)")
        labels = [sink.name for sink in self.sink_specs]
        if len(set(labels)) != len(labels):
            raise ValueError(f"sinks: two sinks are named {labels!r}: give each a distinct label")
        return self

    @model_validator(mode="after")
    def _keyed_writes_need_replayable_columns(self) -> PipelineSpec:
        if not self.wiring.idempotent_sink:
            return self
        for name, expression in self.transform.columns.items():
            if reason := replay_unsafe(expression):
                raise ValueError(
                    f"transform.columns.{name}: {reason}, so a batch replayed after a crash would write other "
                    "values and exactly-once cannot hold; derive it from the record instead, e.g. "
                    f'{name} = "_src_timestamp" (Kafka\'s record timestamp)'
                )
        return self

    @model_validator(mode="after")
    def _lookups_feed_user_code(self) -> PipelineSpec:
        if not self.lookups:
            return self
        if self.transform.user_code is None:
            raise ValueError(
                "lookups: a lookup table is given to your transform: set transform.python = "
                '"module:function" (it receives them) or transform.sql (it reads them as views)'
            )
        names = [lookup.name for lookup in self.lookups]
        if len(set(names)) != len(names) or "records" in names:
            raise ValueError(f"lookups: names {names!r} must be distinct, and not 'records' (the batch's view)")
        if not isinstance(self.source, KafkaSource):
            raise ValueError(
                f"lookups: the versions each batch read are recorded by Kafka offsets; a "
                f"{self.source.kind} source has none"
            )
        if self.wiring.progress_before_write:
            raise ValueError(
                "lookups: at-most-once numbers its batches from 0 again at every start, so the versions "
                "recorded for them would be read for other batches; use exactly-once or at-least-once"
            )
        return self

    @model_validator(mode="after")
    def _state_needs_spark_checkpoint(self) -> PipelineSpec:
        if self.wiring.progress_before_write and self.transform.watermark is not None:
            raise ValueError(
                "guarantee: at-most-once restarts without Spark's checkpoint, state included, so dedup would forget "
                "the ids it saw and let resends through (duplicates at-most-once promises never to write); use "
                "exactly-once or at-least-once with dedup and windows"
            )
        return self

    @model_validator(mode="after")
    def _file_and_table_sources_feed_folder_sinks(self) -> PipelineSpec:
        if not isinstance(self.source, FilesSource | DeltaSource):
            return self
        kind = self.source.kind
        if self.wiring.progress_before_write:
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
        return self

    @model_validator(mode="after")
    def _schema_merging_and_windows_need_delta_append(self) -> PipelineSpec:
        other = next(
            (sink for sink in self.sink_specs if not (isinstance(sink, DeltaSinkSpec) and sink.mode == "append")), None
        )
        other_text = (
            "" if other is None else other.kind + (f" in {other.mode} mode" if isinstance(other, DeltaSinkSpec) else "")
        )
        if self.transform.schema_evolution == "add-columns":
            if self.transform.aggregate is not None:
                raise ValueError("transform.schema_evolution: 'add-columns' carries record fields; windows have none")
            if other is not None:
                raise ValueError(
                    f"transform.schema_evolution: 'add-columns' needs Delta tables in append mode (schema merging), "
                    f"and {self._sinks_key} {other.name!r} is {other_text}: remove schema_evolution or that sink"
                )
        if self.transform.aggregate is not None and other is not None:
            raise ValueError(
                f"{self._sinks_key}.kind: transform.aggregate writes window rows to a Delta table in append mode "
                f'(kind = "delta", mode = "append"), not to {other_text}'
            )
        return self

    @model_validator(mode="after")
    def _avro_comes_from_kafka(self) -> PipelineSpec:
        if self.transform.format == "avro" and not isinstance(self.source, KafkaSource):
            raise ValueError(
                f'transform.format: "avro" reads Kafka record values; a {self.source.kind} source gives rows or lines'
            )
        return self

    @model_validator(mode="after")
    def _sink_columns_are_schema_fields(self) -> PipelineSpec:
        if self.transform.user_code is not None:  # the columns your code makes are known once Spark applies it
            return self  # (streamproof.your_code.transform.check_at_start)
        laid_out = ("partition_by", "zorder_by")  # may also name derived columns, or a window row's columns
        if self.transform.aggregate is not None:  # window rows: the sinks name no record field
            for sink in self.sink_specs:
                for key, column in sink.schema_columns():
                    if key in laid_out and column not in self.transform.aggregate.output_columns:
                        raise ValueError(
                            f"{self._sinks_key}.{key}: {column!r} is not a column of the window rows "
                            f"({', '.join(self.transform.aggregate.output_columns)})"
                        )
            return self
        fields = [*schema_field_names(self.transform.schema_), "_src_topic", "_src_partition", "_src_offset"]
        for sink in self.sink_specs:
            named = sink.schema_columns()
            for key, column in named:
                if column not in fields and not (key in laid_out and column in self.transform.columns):
                    raise ValueError(
                        f"{self._sinks_key}.{key}: {column!r} is not a field of the schema"
                        + (" nor a transform.columns entry" if key in laid_out else "")
                    )
            # A record without its key or group cannot be upserted or totalled: it must be quarantined instead.
            stateful = any(key in ("key", "by") for key, _ in named) and not isinstance(sink, KafkaSinkSpec)
            for key in ("key", "by"):
                needed = getattr(sink, key, None)
                if stateful and needed and needed not in self.transform.required:
                    raise ValueError(
                        f"{self._sinks_key}.{key}: {needed!r} must be listed in transform.required (a record without "
                        "it has nowhere to go but quarantine)"
                    )
        return self

    @model_validator(mode="after")
    def _storage_can_honour_the_guarantee(self) -> PipelineSpec:
        if any(location.scheme == "s3a" for location in self.locations):  # conditional writes: guarantees.S3_CONF
            self.spark.conf.update({key: value for key, value in S3_CONF.items() if key not in self.spark.conf})
        folders = [
            ("delta" if isinstance(sink, DeltaSinkSpec) else "files", self.resolve_path(sink.folder))
            for sink in self.sink_specs
            if isinstance(sink, DeltaSinkSpec | FilesSinkSpec) and sink.folder is not None
        ]
        places = [
            ("checkpoint", "checkpoint", self.checkpoint_dir),
            ("transform.quarantine", "delta", self.quarantine_path),
            *((self._sinks_key, role, folder) for role, folder in folders),
        ]
        for key, role, location in places:
            scheme, conf = location.scheme, self.spark.conf
            if reason := storage_refusal(self.guarantee, scheme, role, conf, bucket=location.bucket):
                raise ValueError(f"{key}: {reason}")
        return self

    @property
    def wiring(self) -> Wiring:
        """How the pipeline is wired for its guarantee: every question "may it lose or duplicate?" is answered there.

        >>> spec.wiring.idempotent_sink, spec.wiring.may_duplicate                    # doctest: +SKIP
        (True, False)
        """
        return wiring_for(self.guarantee)

    @property
    def _sinks_key(self) -> str:
        """How the file names its sinks: ``sink`` or ``sinks``."""
        return "sink" if self.sink is not None else "sinks"

    @property
    def sink_specs(self) -> list[AnySinkSpec]:
        """Every sink of the pipeline, in file order."""
        return [self.sink] if self.sink is not None else list(self.sinks)

    def resolve_path(self, path: str) -> Location:
        """A path of the file: a URI (``hdfs://...``, ``s3a://...``) exactly as written; a plain path relative to the
        current directory when the file was loaded.

        >>> spec = PipelineSpec.model_validate({"name": "p", "source": {"kind": "kafka", "topic": "t"},
        ...     "transform": {"schema": "id STRING"}, "sink": {"kind": "delta", "path": "hdfs://nn:9000/orders"}})
        >>> str(spec.resolve_path("s3a://bucket/orders")), str(spec.quarantine_path)
        ('s3a://bucket/orders', 'hdfs://nn:9000/orders_quarantine')
        """
        return Location.resolved(path, self._base_dir)

    def on_master(self, master: str) -> PipelineSpec:
        """The same pipeline run on another Spark master (``--master``); a bad master is a one-line error."""
        try:
            settings = SparkSettings.model_validate({**self.spark.model_dump(), "master": master})
        except ValueError as error:
            raise ConfigError(f"--master: {str(error).splitlines()[-1].split(', ', 1)[-1]}") from None
        moved = self.model_copy(update={"spark": settings})
        moved._base_dir, moved._source_name, moved._env_references = (
            self._base_dir,
            self._source_name,
            self._env_references,
        )
        return moved

    @property
    def locations(self) -> list[Location]:
        """Every place the pipeline reads or writes files: checkpoint, quarantine, folder sinks, a folder source."""
        folders = [sink.folder for sink in self.sink_specs if sink.folder is not None]
        source = [self.source.path] if isinstance(self.source, FilesSource | DeltaSource) else []
        lookups = [lookup.path for lookup in self.lookups]
        return [self.checkpoint_dir, self.quarantine_path, *map(self.resolve_path, [*folders, *source, *lookups])]

    @property
    def on_distributed_storage(self) -> bool:
        """Whether some of its files are reached through Hadoop's FileSystem (URIs), so through Spark's JVM."""
        return any(location.is_remote for location in self.locations)

    @property
    def checkpoint_dir(self) -> Location:
        return self.resolve_path(self.checkpoint or f".streamproof/checkpoints/{self.name}")

    @property
    def state_dir(self) -> Location:
        """What streamproof records of the pipeline outside its checkpoint, beside it (``<checkpoint>.streamproof``),
        so that a lost, restored or recovered checkpoint cannot take it along: the batches handed to your own sinks,
        the lookup versions each batch read, the tracebacks of your code's failures.

        >>> spec = PipelineSpec.model_validate({"name": "p", "checkpoint": "/data/cp/orders", "source": {"kind":
        ...     "kafka", "topic": "t"}, "transform": {"schema": "id STRING"}, "sink": {"kind": "delta", "path": "/t"}})
        >>> str(spec.state_dir)
        '/data/cp/orders.streamproof'
        """
        checkpoint = self.checkpoint_dir
        return checkpoint.with_name(f"{checkpoint.name}.streamproof")

    @property
    def quarantine_path(self) -> Location:
        if self.transform.quarantine:
            return self.resolve_path(self.transform.quarantine)
        folder = self.sink_specs[0].folder
        if folder is not None:
            return self.resolve_path(f"{folder}_quarantine")
        return self.resolve_path(f".streamproof/tables/{self.name}_quarantine")
