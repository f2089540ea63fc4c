"""``streamproof bench``: throughput, latency, recovery, per-sink speed, scaling and tuning, each a ratio against
baselines measured in the same run.

Absolute figures on a shared 2-core machine move by 10-20% from one run to the next, so every benchmark
reports ratios between measurements taken in the same run, on the same data, one after the other. Each
benchmark is a room of :mod:`streamproof.bench`; this one runs them and writes the results.

Example::

    >>> check_request(["throughput", "nonsense"], 100_000)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: unknown benchmark 'nonsense': expected one of throughput, latency, ...
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyspark

from streamproof.bench.age import bench_age
from streamproof.bench.cluster import bench_cluster
from streamproof.bench.common import DEFAULT_EVENTS, RESULTS, Bench, Emit
from streamproof.bench.latency import bench_latency
from streamproof.bench.partitioned import bench_partitioned
from streamproof.bench.recovery import bench_recovery
from streamproof.bench.scaling import bench_scaling
from streamproof.bench.sinks import bench_sinks
from streamproof.bench.throughput import bench_throughput
from streamproof.bench.tuning import bench_tuning
from streamproof.errors import ConfigError
from streamproof.infra import KafkaBroker, PostgresServer
from streamproof.jvm.jars import cached_jars, check_java

RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "throughput": bench_throughput,
    "latency": bench_latency,
    "recovery": bench_recovery,
    "sinks": bench_sinks,
    "scaling": bench_scaling,
    "tuning": bench_tuning,
    "partitioned": bench_partitioned,
    "cluster": bench_cluster,
    "age": bench_age,
}
BENCHMARKS = tuple(RUNNERS)
# Not by default: cluster needs `infra up --spark-workers`; partitioned measures a table layout a user chooses,
# not the product's own speed; age spends minutes making a 50,000-commit table.
DEFAULT_BENCHMARKS = tuple(name for name in BENCHMARKS if name not in ("cluster", "partitioned", "age"))
# What the command prints of each benchmark's results (the whole document goes to the results file).
SUMMARY_KEYS = (
    "ratios",
    "targets_met",
    "latency",
    "latency_after_warmup",
    "median_phases_s",
    "ratios_vs_delta_append",
    "median_s",
    "standby_median_s",
)


def machine_facts() -> dict[str, Any]:
    """Cores, memory, versions and date, stored with every result."""
    memory_kb = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )
    jars = {jar.name for jar in cached_jars("spark")} | {jar.name for jar in cached_jars("kafka")}
    delta_jar = next((n for n in jars if n.startswith("delta-spark")), "")
    kafka_jar = next((n for n in jars if re.match(r"kafka_2\.13-[\d.]+\.jar", n)), "")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kb / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "java": check_java(),
        "pyspark": pyspark.__version__,
        "delta_jar": delta_jar,
        "kafka_broker_jar": kafka_jar,
        "commit": commit or None,
    }


def check_request(names: list[str], events: int) -> None:
    """Refuse unknown benchmark names and data too small to measure anything but start-up (one line each).

    >>> check_request(["throughput"], 100_000)
    """
    unknown = [name for name in names if name not in RUNNERS]
    if unknown:
        raise ConfigError(f"unknown benchmark {unknown[0]!r}: expected one of {', '.join(BENCHMARKS)}")
    if events < 10_000:
        raise ConfigError(f"--events {events}: at least 10,000 (a benchmark of fewer measures only start-up)")


def run_benchmarks(
    names: list[str],
    *,
    bootstrap: str,
    state_dir: Path,
    events: int = DEFAULT_EVENTS,
    emit: Emit = print,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the named benchmarks in order; return the results document (machine facts + one entry each)."""
    check_request(names, events)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    bench = Bench(bootstrap, state_dir / "bench" / stamp, events, emit)
    document: dict[str, Any] = {"machine": machine_facts(), "events": events, "results": {}}
    options = options or {}
    try:
        for name in names:
            emit(f"── {name} ──")
            started = time.monotonic()
            runner = RUNNERS[name]
            result = runner(bench, **options.get(name, {}))
            result["bench_seconds"] = round(time.monotonic() - started, 1)
            document["results"][name] = result
    finally:
        if bench._spark is not None:
            bench._spark.stop()
        shutil.rmtree(bench.workdir, ignore_errors=True)
    return document


def write_results(document: dict[str, Any], results_dir: Path = RESULTS, json_file: Path | None = None) -> Path:
    """``<results_dir>/<date>-<names>.json`` (and ``json_file`` when given); returns the results path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    names = "-".join(document["results"])
    stamp = document["machine"]["date"].replace(":", "").replace("-", "")[:15]
    path = results_dir / f"{stamp}-{names}.json"
    text = json.dumps(document, indent=2)
    path.write_text(text)
    if json_file is not None:
        json_file.parent.mkdir(parents=True, exist_ok=True)
        json_file.write_text(text)
    return path


def run_on_local_servers(
    names: list[str],
    *,
    state_dir: Path,
    bootstrap: str | None,
    events: int = DEFAULT_EVENTS,
    emit: Emit = print,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`run_benchmarks` on ``bootstrap``, or on the local broker (started for the run and stopped after it
    when it was not running); the local PostgreSQL likewise for the ``sinks`` benchmark."""
    check_request(names, events)
    started: list[KafkaBroker | PostgresServer] = []
    if bootstrap is None:
        broker = KafkaBroker(state_dir)
        bootstrap = broker.bootstrap_servers
        if not broker.running():
            emit(broker.up())
            started.append(broker)
    if "sinks" in names:
        postgres = PostgresServer(state_dir)
        if not postgres.running():
            emit(postgres.up())
            started.append(postgres)
    try:
        return run_benchmarks(
            names, bootstrap=bootstrap, state_dir=state_dir, events=events, emit=emit, options=options
        )
    finally:
        for server in reversed(started):
            emit(server.down())


def summary_lines(document: dict[str, Any]) -> list[str]:
    """One line per benchmark: its ratios, targets and headline figures, as JSON."""
    return [
        f"{name}: {json.dumps({key: value for key, value in result.items() if key in SUMMARY_KEYS})}"
        for name, result in document["results"].items()
    ]
