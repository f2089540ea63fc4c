"""A fresh pipeline's first batch on Java 17 with streamproof's class-data archive against Java 25 with an AOT cache
(JEP 483/514/515: classes loaded and linked, and method profiles, from a training run), alternated, each a fresh
process draining the bench topic as `bench throughput` does (``Bench.drain`` of
``benchmarks/pipelines/throughput_delta.toml``).

The AOT cache is trained once, by a drain of the same topic on Java 25 with ``-XX:AOTCacheOutput`` (the JVM writes
it as it exits); the measured Java 25 runs start with ``-XX:AOTCache``. The other JVM options are streamproof's.

Usage (Kafka up, e.g. ``streamproof infra up``; a JDK 25 at ``JAVA25_HOME``)::

    python benchmarks/profile_java25_aot.py [ROUNDS]

Prints each run's figures (``figures_of_run``, and when its query started after the launch), then the medians of
each variant.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from streamproof.bench.common import Bench, relocated
from streamproof.bench.throughput import figures_of_run
from streamproof.config import SparkSettings
from streamproof.jvm.session import session_conf

JAVA25_HOME = Path(os.environ.get("JAVA25_HOME", "/usr/lib/jvm/temurin-25-jdk-amd64"))
EVENTS = 2_000_000
_PLAIN = dict(os.environ)


def on_java(version: int) -> None:
    """The children started next run on Java ``version`` (17: this machine's default)."""
    os.environ.clear()
    os.environ.update(_PLAIN)
    if version == 25:
        os.environ["JAVA_HOME"] = str(JAVA25_HOME)
        os.environ["PATH"] = f"{JAVA25_HOME / 'bin'}{os.pathsep}{_PLAIN['PATH']}"


def drained(bench: Bench, topic: str, name: str, java: int, aot: str | None = None) -> dict[str, Any]:
    """One fresh drain of ``topic`` on Java ``java`` (``aot``: the AOT cache's option), its figures."""
    pipeline = bench.pipeline("throughput_delta", topic, name)
    on_java(java)
    if aot is not None:
        options = session_conf(SparkSettings())["spark.driver.extraJavaOptions"]
        relocated(pipeline, None, conf={"spark.driver.extraJavaOptions": f"{options} {aot}"})
    run = bench.drain(pipeline)
    on_java(17)
    figures = figures_of_run(run)
    figures["query_started_s"] = round(run.query_started_at or 0, 2)
    return figures


def main(rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="streamproof-java25-"))
    bench = Bench(bootstrap=os.environ.get("BOOTSTRAP", "127.0.0.1:9092"), workdir=work, events=EVENTS)
    topic = bench.topic(EVENTS)
    cache = work / "spark.aot"
    drained(bench, topic, "train", 25, aot=f"-XX:AOTCacheOutput={cache}")
    if not cache.exists():  # Java 25's training JVM exits 0 even when the cache's assembly failed
        raise SystemExit(f"the training run wrote no AOT cache at {cache}")
    results: dict[str, list[dict[str, Any]]] = {"java17-archive": [], "java25-aot": []}
    for round_ in range(rounds):
        for variant, java, aot in (("java17-archive", 17, None), ("java25-aot", 25, f"-XX:AOTCache={cache}")):
            figures = drained(bench, topic, f"{variant}-{round_}", java, aot)
            print(variant, round_, json.dumps(figures), flush=True)
            results[variant].append(figures)
    for variant, runs in results.items():
        keys = ("rows_per_second", "rows_per_second_from_launch", "first_batch_s", "steady_rows_per_second")
        print(variant, {key: statistics.median(run[key] for run in runs) for key in keys})


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
