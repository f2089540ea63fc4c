"""``streamproof bench scaling``: the Delta pipeline on N/2, N and 2N events: rows/s, peak memory of the pipeline
process tree, rows/s of every batch (``docs/performance.png`` is drawn from it with ``--plot``).

Example::

    $ streamproof bench scaling --plot docs/performance.png                              # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamproof.bench.common import Bench, ratio
from streamproof.errors import ConfigError


def bench_scaling(bench: Bench) -> dict[str, Any]:
    """The Delta pipeline at N/2, N and 2N events: does the cost per row stay flat, does memory stay bounded?"""
    sizes = [bench.events // 2, bench.events, bench.events * 2]
    points = []
    for events in sizes:
        topic = bench.topic(events)
        run = bench.drain(bench.pipeline("throughput_delta", topic, f"scaling-{events}"))
        points.append({"events": events, **run.to_dict()})
    base = points[0]["rows_per_second"]
    for point in points:
        point["rows_per_second_vs_smallest"] = ratio(point["rows_per_second"], base)
    return {"points": points}


def plot_scaling(document: dict[str, Any], png: Path) -> Path:
    """Draw rows/s of every batch of the scaling runs (one line per data size) into ``png``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib (make setup installs it)") from None
    points = document["results"].get("scaling", {}).get("points")
    if not points:
        raise ConfigError("--plot draws the scaling benchmark: run `streamproof bench scaling --plot FILE`")
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for point in points:
        rates = point["batch_rows_per_second"]
        if len(rates) > 1 and rates[-1] < max(rates) / 100:
            rates = rates[:-1]  # the drain's last batch holds the few records left: its rate says nothing
        axes.plot(
            range(len(rates)), rates, marker="o", label=f"{point['events']:,} events ({point['batches']} batches)"
        )
    machine = document["machine"]
    axes.set_title(f"Kafka -> Delta exactly-once, rows/s per batch ({machine['cores']} cores, {machine['date'][:10]})")
    axes.set_xlabel("batch")
    axes.set_ylabel("rows/s (batch rows / batch duration)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png)
    plt.close(figure)
    return png
