"""Where a micro-batch's time goes: run a pipeline in this process and print each batch's phases.

Usage (Kafka up, the topic filled, e.g. by ``streamproof bench throughput``)::

    python benchmarks/profile_batch.py PIPELINE.toml [MAX_BATCHES]

Prints, per committed batch, the phases of :mod:`streamproof.pipeline.phases` (Spark's planning and logs, the
read + parse + cache, the quarantine commit, each sink's write and commit), as ``streamproof bench`` does.
"""

from __future__ import annotations

import sys

from streamproof.bench.common import phases_line
from streamproof.config import load_pipeline
from streamproof.pipeline.events import BatchCommitted, Event
from streamproof.pipeline.query import run


def show(event: Event) -> None:
    print(event.line())
    if isinstance(event, BatchCommitted):
        print("  " + phases_line({"batch": event.batch_id, "duration_s": event.duration_s,
                                  "queued_s": event.queued_s, "phases": event.phases}))  # fmt: skip


def main() -> None:
    spec = load_pipeline(sys.argv[1])
    max_batches = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    run(spec, available_now=True, max_batches=max_batches, on_event=show)


if __name__ == "__main__":
    main()
