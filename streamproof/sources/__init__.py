"""Replayable sources: each yields a DataFrame carrying the source coordinates of every record.

All give Kafka-shaped rows (``topic``, ``partition``, ``offset``, ``timestamp``, ``value``), the coordinates of a
record: a Kafka record's own, a file's path and line (:mod:`streamproof.sources.files`), or a Delta table row's
(:mod:`streamproof.sources.delta`: the Kafka coordinates a bronze table carries).

Example::

    >>> stream = read_stream(spark, spec)                      # doctest: +SKIP
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from streamproof.config import DeltaSource, FilesSource, PipelineSpec
from streamproof.kafka_client import Watermarks, require_topic
from streamproof.sources import delta, files, kafka
from streamproof.transform.avro import avro_contract
from streamproof.transform.records import check_avro_fields, parse_records


def require_available(spec: PipelineSpec) -> Watermarks | None:
    """Fail in one line when the source is not there (no topic, no folder, no table); a topic's watermarks, read
    to check it, are returned (the start's check of the checkpoint against the topic uses them)."""
    if isinstance(spec.source, FilesSource):
        files.require_folder(spec)
    elif isinstance(spec.source, DeltaSource):
        delta.require_table(spec)
    else:
        return require_topic(spec.source)
    return None


def read_stream(spark: SparkSession, spec: PipelineSpec, *, starting_offsets: str | None = None) -> DataFrame:
    """The pipeline's source as a stream (``starting_offsets``: Kafka only, at-most-once restarts)."""
    if isinstance(spec.source, FilesSource):
        return files.read_stream(spark, spec)
    if isinstance(spec.source, DeltaSource):
        return delta.read_stream(spark, spec)
    return kafka.read_stream(spark, spec.source, starting_offsets=starting_offsets)


def read_batch(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """Everything the source holds now, as verification reads it."""
    if isinstance(spec.source, FilesSource):
        return files.read_batch(spark, spec)
    if isinstance(spec.source, DeltaSource):
        return delta.read_batch(spark, spec)
    return kafka.read_batch(spark, spec.source)


def parsed_records(records: DataFrame, spec: PipelineSpec) -> DataFrame:
    """:func:`streamproof.transform.records.parse_records` of the pipeline's records: Avro ones with the writer schema
    of their file or registry (asked now: each start reads the subject's latest version), checked against the declared
    fields first. The pipeline and ``streamproof verify`` both parse through this.

    >>> parsed_records(read_stream(spark, spec), spec).columns[-1]                             # doctest: +SKIP
    '_reject_reason'
    """
    contract = avro_contract(spec)
    if contract is None:
        return parse_records(records, spec.transform)
    check_avro_fields(spec.transform, contract.schema_json)
    return parse_records(records, spec.transform, avro_schema=contract.schema_json, avro_header=contract.header())
