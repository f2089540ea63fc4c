"""Sinks: each writes one micro-batch and honours the pipeline's guarantee (DESIGN.md, layer 3).

:func:`open_sink` is the factory: one runtime sink per ``[sink]`` / ``[[sinks]]`` entry of a pipeline file;
the rule every sink follows is stated in :mod:`streamproof.sinks.base`, each sink's mechanism in its room.

Example::

    >>> from streamproof.config import parse_pipeline
    >>> spec = parse_pipeline('name = "p"\\n[source]\\nkind = "kafka"\\ntopic = "t"\\n[transform]\\n'
    ...                       'schema = "event_id STRING"\\n[sink]\\nkind = "delta"\\npath = "/tmp/p"')
    >>> [sink.location for sink in open_sinks(spec)]
    ['/tmp/p']
"""

from __future__ import annotations

from streamproof.config import AnySinkSpec, DeltaSinkSpec, KafkaSinkSpec, PipelineSpec, PostgresSinkSpec, PythonSinkSpec
from streamproof.sinks.base import Sink
from streamproof.sinks.delta import DeltaSink
from streamproof.sinks.files import FilesSink
from streamproof.sinks.kafka import KafkaSink
from streamproof.sinks.python import PythonSink


def open_sink(pipeline: PipelineSpec, spec: AnySinkSpec) -> Sink:
    """The runtime sink for one ``[sink]`` / ``[[sinks]]`` entry of a pipeline file."""
    if isinstance(spec, DeltaSinkSpec):
        return DeltaSink(pipeline, spec)
    if isinstance(spec, PostgresSinkSpec):
        from streamproof.sinks.postgres import PostgresSink  # psycopg (0.18 s a start) only where PostgreSQL is used

        return PostgresSink(pipeline, spec)
    if isinstance(spec, KafkaSinkSpec):
        return KafkaSink(pipeline, spec)
    if isinstance(spec, PythonSinkSpec):
        return PythonSink(pipeline, spec)
    return FilesSink(pipeline, spec)


def open_sinks(pipeline: PipelineSpec) -> list[Sink]:
    """Every sink of the pipeline, in file order."""
    return [open_sink(pipeline, spec) for spec in pipeline.sink_specs]
