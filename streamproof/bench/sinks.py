"""``streamproof bench sinks``: rows/s of Delta MERGE, PostgreSQL upsert, Kafka transactional and Parquet, on the
same data, each against Delta append of the same run.

Example::

    $ streamproof bench sinks --events 500000                                             # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from streamproof.bench.common import Bench, ratio

SINK_PIPELINES = {
    "delta_merge": "sinks_delta_merge",
    "postgres_upsert": "sinks_postgres_upsert",
    "kafka_transactional": "sinks_kafka",
    "files": "sinks_files",
}


def bench_sinks(bench: Bench) -> dict[str, Any]:
    """rows/s of each exactly-once sink on the throughput data, and its ratio to Delta append in the same run."""
    topic = bench.topic(bench.events)
    results = {"delta_append": bench.drain(bench.pipeline("throughput_delta", topic, "sinks-delta-append")).to_dict()}
    for label, template in SINK_PIPELINES.items():
        bench.emit(f"sink: {label}")
        results[label] = bench.drain(bench.pipeline(template, topic, f"sinks-{label}")).to_dict()
    base = results["delta_append"]["rows_per_second"]
    return {
        "events": bench.events,
        "sinks": results,
        "ratios_vs_delta_append": {k: ratio(v["rows_per_second"], base) for k, v in results.items()},
    }
