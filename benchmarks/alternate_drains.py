"""Spark settings against each other, in alternated fresh drains of the bench topic: each variant a fresh process
draining it as `bench throughput` runs ours (``Bench.drain`` of ``benchmarks/pipelines/throughput_delta.toml``) or, for
a variant whose name starts with ``native``, Spark's own Delta sink (``benchmarks/native_delta_sink.py``); a variant
whose name starts with ``clean`` drains the topic of valid records only (what the malformed ones cost), with the
variant's settings added to the pipeline file's ``[spark.conf]``. The variants' order turns by one each round, so that
none always runs first on a machine whose speed drifts. Prints each run's whole rate, first batch, steady rate and
first commit from the launch (and, for ours, the first batch's phases), then the medians per variant.

Usage (Kafka up, e.g. ``streamproof infra up``)::

    python benchmarks/alternate_drains.py ROUNDS NAME=[KEY=VALUE[;KEY=VALUE...]] ...
    python benchmarks/alternate_drains.py 3 ours= 'ours-no-list=spark.databricks.delta.allFilesInCrc.enabled=true'
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from streamproof.bench.common import Bench, relocated
from streamproof.bench.throughput import figures_of_native, figures_of_run, native_delta_sink_rate

EVENTS = 2_000_000
FIGURES = ("rows_per_second", "first_batch_s", "steady_rows_per_second", "first_commit_from_launch_s")


def variant(argument: str) -> tuple[str, dict[str, str]]:
    """A variant's name and its Spark settings, from ``NAME=KEY=VALUE;KEY=VALUE``.

    >>> variant("ours-no-list=spark.databricks.delta.allFilesInCrc.enabled=true;spark.sql.shuffle.partitions=4")
    ('ours-no-list', {'spark.databricks.delta.allFilesInCrc.enabled': 'true', 'spark.sql.shuffle.partitions': '4'})
    >>> variant("ours=")
    ('ours', {})
    """
    name, _, settings = argument.partition("=")
    return name, dict(setting.split("=", 1) for setting in settings.split(";") if setting)


def drain(bench: Bench, topic: str, name: str, conf: dict[str, str], tag: str) -> dict[str, Any]:
    """One fresh drain of ``topic``: ours, or Spark's own sink for a name starting with ``native``."""
    pipeline = bench.pipeline("throughput_delta", topic, tag)
    if conf:
        relocated(pipeline, None, conf=conf)
    if name.startswith("native"):
        native = figures_of_native(native_delta_sink_rate(bench, pipeline, f"{tag}-out"))
        return {key: native[key] for key in FIGURES}
    drained = bench.drain(pipeline)
    ours = figures_of_run(drained)
    figures = {key: ours[key] for key in FIGURES}
    return {**figures, "first_batch_phases": drained.batches[0].get("phases") if drained.batches else None}


def main(rounds: int, variants: list[tuple[str, dict[str, str]]]) -> None:
    bench = Bench(bootstrap="127.0.0.1:9092", workdir=Path(tempfile.mkdtemp(prefix="alternate-drains-")), events=EVENTS)
    topic, clean_topic = bench.topic(EVENTS), bench.topic(EVENTS, malformed=0.0)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for round_ in range(rounds):
        turn = round_ % len(variants)
        for name, conf in variants[turn:] + variants[:turn]:
            drained = clean_topic if name.startswith("clean") else topic
            figures = drain(bench, drained, name, conf, f"{name}-{round_}")
            print(name, round_, json.dumps(figures), flush=True)
            runs[name].append(figures)
    for name, figures in runs.items():
        medians = {key: statistics.median(run[key] for run in figures if run[key] is not None) for key in FIGURES}
        print("median", name, json.dumps(medians))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(int(sys.argv[1]), [variant(argument) for argument in sys.argv[2:]])
