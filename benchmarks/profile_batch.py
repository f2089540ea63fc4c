"""Where a micro-batch's time goes: run a pipeline in this process and time each phase of every batch.

Usage (Kafka up, the topic filled, e.g. by ``streamproof bench throughput``)::

    python benchmarks/profile_batch.py PIPELINE.toml [MAX_BATCHES]

Prints, per batch: the whole ``foreachBatch`` call, the quarantine append and each sink write (seconds);
the rest of the call is the parse into the batch cache and the count of valid/invalid records. Spark's
own per-batch work (offset log, commit log) is the batch duration in the progress line minus the call.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from streamproof.config import load_pipeline
from streamproof.pipeline import batches as batch_module
from streamproof.pipeline.query import run

TIMINGS: dict[str, list[float]] = {}


def timed(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return function(*args, **kwargs)
        finally:
            TIMINGS.setdefault(label, []).append(round(time.monotonic() - started, 3))

    return wrapper


def main() -> None:
    spec = load_pipeline(sys.argv[1])
    max_batches = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    batch_module.append_batch = timed("quarantine_append", batch_module.append_batch)
    batch_module.BatchWriter.__call__ = timed("foreach_batch", batch_module.BatchWriter.__call__)
    batch_module.BatchWriter._write_retrying = timed("sink_writes", batch_module.BatchWriter._write_retrying)
    run(spec, available_now=True, max_batches=max_batches, on_event=lambda event: print(event.line()))
    print(json.dumps(TIMINGS))


if __name__ == "__main__":
    main()
