"""``streamproof bench tuning``: each default changed in the optimisation round, before and after, on the same data
in the same run.

Example::

    $ streamproof bench tuning                                                             # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from streamproof.bench.common import Bench, ratio
from streamproof.config import SparkSettings

FORMER_MAX_OFFSETS = 100_000


def bench_tuning(bench: Bench) -> dict[str, Any]:
    """Each default changed in the optimisation round, before and after, on the same data in the same run."""

    topic = bench.topic(bench.events)
    changes: dict[str, Any] = {}
    bench.emit(f"max_offsets_per_trigger: former default {FORMER_MAX_OFFSETS:,} vs the current one")
    before = bench.drain(
        bench.pipeline(
            "throughput_delta", topic, "tuning-batch-before", source={"max_offsets_per_trigger": FORMER_MAX_OFFSETS}
        )
    )
    after = bench.drain(bench.pipeline("throughput_delta", topic, "tuning-batch-after"))
    changes["max_offsets_per_trigger"] = {
        "before": before.to_dict(),
        "after": after.to_dict(),
        "speedup": ratio(after.rows_per_second, before.rows_per_second),
    }
    bench.emit("[spark] gc: G1 (the JVM's default, streamproof's former) vs the parallel collector")
    g1_runs, parallel_runs = [], []
    for round_number in (1, 2):
        g1_runs.append(
            bench.drain(
                bench.pipeline("throughput_delta", topic, f"tuning-gc-g1-{round_number}", spark=SparkSettings(gc="g1"))
            )
        )
        parallel_runs.append(
            bench.drain(bench.pipeline("throughput_delta", topic, f"tuning-gc-parallel-{round_number}"))
        )
    g1_rate = sum(run.rows_per_second for run in g1_runs) / 2
    parallel_rate = sum(run.rows_per_second for run in parallel_runs) / 2
    changes["gc"] = {
        "before": [run.to_dict() for run in g1_runs],
        "after": [run.to_dict() for run in parallel_runs],
        "speedup": ratio(parallel_rate, g1_rate),
        "peak_memory_ratio": ratio(
            sum(r.peak_memory_mb for r in parallel_runs), sum(r.peak_memory_mb for r in g1_runs)
        ),
    }
    return {"events": bench.events, "changes": changes}
