"""The pipeline file (TOML) as a typed, validated spec: the one face of configuration.

Rooms: :mod:`~streamproof.config.file` (TOML text, ``${ENV}``, dump), :mod:`~streamproof.config.sources`,
:mod:`~streamproof.config.transform`, :mod:`~streamproof.config.sinks`, :mod:`~streamproof.config.settings`
(trigger, retry, metrics, Spark) and :mod:`~streamproof.config.pipeline` (the rules across sections).

Example::

    >>> from streamproof.config import load_pipeline
    >>> load_pipeline("examples/orders_to_delta.toml").sink.kind      # doctest: +SKIP
    'delta'
"""

from streamproof.config.fields import COORDINATES, duration_seconds, schema_field_names, schema_field_type
from streamproof.config.file import dump_pipeline, load_pipeline, parse_pipeline
from streamproof.config.pipeline import PipelineSpec
from streamproof.config.settings import MetricsSettings, RetrySettings, SparkSettings, Trigger
from streamproof.config.sinks import (
    AnySinkSpec,
    DeltaSinkSpec,
    FilesSinkSpec,
    KafkaSinkSpec,
    PostgresSinkSpec,
    PythonSinkSpec,
    SinkSpec,
)
from streamproof.config.sources import DeltaSource, FilesSource, KafkaSource, Lookup, SourceSpec
from streamproof.config.transform import Aggregate, Dedup, Transform, replay_unsafe

__all__ = [
    "COORDINATES",
    "Aggregate",
    "AnySinkSpec",
    "Dedup",
    "DeltaSinkSpec",
    "DeltaSource",
    "FilesSinkSpec",
    "FilesSource",
    "KafkaSinkSpec",
    "KafkaSource",
    "Lookup",
    "MetricsSettings",
    "PipelineSpec",
    "PostgresSinkSpec",
    "PythonSinkSpec",
    "RetrySettings",
    "SinkSpec",
    "SourceSpec",
    "SparkSettings",
    "Transform",
    "Trigger",
    "dump_pipeline",
    "duration_seconds",
    "load_pipeline",
    "parse_pipeline",
    "replay_unsafe",
    "schema_field_names",
    "schema_field_type",
]
