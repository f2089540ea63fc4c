"""``[source]``: where the records come from (Kafka, a folder of JSON-lines files, a Delta table).

Example::

    >>> KafkaSource(kind="kafka", topic="orders").spark_options()["subscribe"]
    'orders'
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from streamproof.config.fields import Strict, kafka_passthrough

# Larger fetches than the consumer's defaults (1 MB per partition, 500 records per poll): a 100k-record
# batch then takes a few round trips instead of dozens; measured +20% on the raw read of a topic.
# A fetch that finds no record returns after 10 ms, not the client's 500: a batch whose tasks read up to the log's
# end while nothing new arrives (the last batch of a catch-up or of an available-now run, a quiet topic) waited on
# fetches there. Alternated fresh drains of the bench topic (docs/performance.md, 2026-11-29): the batch reaching
# the end 3.17 s against 4.2 s, the batches before it unchanged. Under a steady stream the fetches find records.
# Any "kafka.*" key of the pipeline file overrides these.
KAFKA_CONSUMER_DEFAULTS = {
    "kafka.max.partition.fetch.bytes": str(16 << 20),
    "kafka.fetch.max.bytes": str(64 << 20),
    "kafka.max.poll.records": "20000",
    "kafka.fetch.max.wait.ms": "10",
}


class KafkaSource(Strict):
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
        return kafka_passthrough(data)

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


class FilesSource(Strict):
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


class DeltaSource(Strict):
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


class Lookup(Strict):
    """``[[lookups]]``: a Delta table your transform joins each batch with (a stream-static join), by ``name``.

    With ``pin = true`` (default) the table version each batch read is recorded in the checkpoint, and a batch
    replayed after a crash reads that same version (Delta time travel), so it is the same batch again; with
    ``pin = false`` each attempt reads the newest version, as Spark's stream-static join does.

    >>> Lookup(name="customers", path="tables/customers").pin
    True
    """

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    path: str = Field(min_length=1)
    pin: bool = True
