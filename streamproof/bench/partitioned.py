"""``streamproof bench partitioned``: rows/s of a partitioned Delta table against the same table unpartitioned, for
append (by the event's hour) and MERGE (by a bucket of the key), on the same data in the same run.

Both runs of a mode have the same derived columns; only ``partition_by`` differs. The runs alternate (unpartitioned,
partitioned, per mode) so that neither always meets a warmer machine.

Example::

    $ streamproof bench partitioned --events 500000                                       # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamproof.bench.common import Bench, ratio
from streamproof.config import DeltaSinkSpec, dump_pipeline, load_pipeline

MODES = {"append": "partitioned_delta_append", "merge": "partitioned_delta_merge"}


def unpartitioned(pipeline_file: Path) -> Path:
    """The same pipeline file with its Delta sink not partitioned (rewritten in place)."""
    spec = load_pipeline(pipeline_file)
    assert isinstance(spec.sink, DeltaSinkSpec), "the partitioned benchmarks write one Delta sink"
    pipeline_file.write_text(
        dump_pipeline(spec.model_copy(update={"sink": spec.sink.model_copy(update={"partition_by": []})}))
    )
    return pipeline_file


def bench_partitioned(bench: Bench) -> dict[str, Any]:
    """rows/s of each mode unpartitioned and partitioned, and partitioned over unpartitioned per mode."""
    topic = bench.topic(bench.events)
    results: dict[str, Any] = {}
    for mode, template in MODES.items():
        for partitioned in (False, True):
            label = f"{mode}_{'partitioned' if partitioned else 'unpartitioned'}"
            bench.emit(f"partitioned: {label}")
            pipeline_file = bench.pipeline(template, topic, f"partitioned-{label}")
            results[label] = bench.drain(pipeline_file if partitioned else unpartitioned(pipeline_file)).to_dict()
    ratios = {
        mode: ratio(
            results[f"{mode}_partitioned"]["rows_per_second"], results[f"{mode}_unpartitioned"]["rows_per_second"]
        )
        for mode in MODES
    }
    return {
        "events": bench.events,
        "runs": results,
        "ratios": {f"{mode}_partitioned_over_unpartitioned": value for mode, value in ratios.items()},
    }
