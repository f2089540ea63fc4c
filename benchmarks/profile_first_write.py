"""The first batch of a restarted pipeline, with the first keyed Delta write of the run through streamproof's replay
rule and Delta's transaction API (the table's newest commit files read,
:meth:`streamproof.sinks.delta.DeltaSink.append`) or through Delta's writer and its own lookup (a state rebuild of the
table): alternated, each in a fresh process, so each first batch runs on a cold JVM as after a crash.

Usage (Kafka up, the topic filled, e.g. by ``streamproof bench throughput``)::

    python benchmarks/profile_first_write.py PIPELINE.toml [ROUNDS]

The pipeline runs 3 batches first (its tables then exist), then each round restarts it for one batch per variant.
Prints each restart's batch line and phases, then the median batch duration of each variant.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys


def one_batch(pipeline_file: str, variant: str) -> dict[str, object]:
    """One batch in a fresh process (``variant``: ``checked`` or ``delta-writer``); its event as a dict."""
    code = f"""
import json
import streamproof.sinks.delta as delta
from streamproof.config import load_pipeline
from streamproof.pipeline.events import BatchCommitted
from streamproof.pipeline.query import run
if {variant!r} == "delta-writer":  # every write through Delta's writer and its lookup
    delta.fits_table = lambda frame, txn: False
events = []
run(load_pipeline({pipeline_file!r}), available_now=True, max_batches=1,
    on_event=lambda e: events.append(e) if isinstance(e, BatchCommitted) else None)
e = events[0]
print(json.dumps({{"batch": e.batch_id, "duration_s": e.duration_s, "phases": e.phases}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    pipeline_file = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    subprocess.run([sys.executable, "-m", "streamproof", "run", pipeline_file, "--max-batches", "3"], check=True,
                   capture_output=True)  # fmt: skip
    durations: dict[str, list[float]] = {"checked": [], "delta-writer": []}
    for round_number in range(rounds):
        for variant in durations:
            batch = one_batch(pipeline_file, variant)
            durations[variant].append(float(batch["duration_s"]))  # type: ignore[arg-type]
            print(f"round {round_number + 1}, {variant}: {json.dumps(batch)}", flush=True)
    for variant, seconds in durations.items():
        print(f"{variant}: median {statistics.median(seconds):.2f} s of {seconds}")


if __name__ == "__main__":
    main()
