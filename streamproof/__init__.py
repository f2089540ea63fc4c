"""streamproof: streaming pipelines (Kafka, files, Delta -> Spark Structured Streaming -> Delta, PostgreSQL, Kafka,
Parquet) with end-to-end exactly-once delivery, and the proof: crash every phase of a micro-batch with real
SIGKILLs, restart, reconcile source against sink record by record.

The face for library use: a :class:`Pipeline` (a pipeline file's sections as typed keyword arguments, or the file
itself), and :func:`run`, :func:`verify` and :func:`prove` on it. What ``streamproof run|verify|prove`` do.

Example (a folder of JSON-lines files into a Delta table, exactly-once, then a proof through a SIGKILL right
after the sink's commit; this example runs in the test suite)::

    >>> import tempfile
    >>> from pathlib import Path
    >>> from streamproof import Pipeline, prove, run, verify
    >>> work = Path(tempfile.mkdtemp())
    >>> (work / "in").mkdir()
    >>> _ = (work / "in" / "0.json").write_text('{"event_id": "e1", "amount": 2.5}\\n{"amount": 1.0}\\n')
    >>> pipeline = Pipeline(
    ...     name="orders",
    ...     checkpoint=work / "checkpoint",
    ...     source={"kind": "files", "path": work / "in", "max_files_per_trigger": 1},
    ...     transform={"schema": "event_id STRING, amount DOUBLE", "required": ["event_id"]},
    ...     sink={"kind": "delta", "path": work / "orders"},
    ... )
    >>> summary = run(pipeline, available_now=True)
    >>> summary.rows_in, summary.rows_out, summary.quarantined
    (2, 1, 1)
    >>> for n in (1, 2):  # two more files: two more batches, the second killed right after the sink's commit
    ...     _ = (work / "in" / f"{n}.json").write_text(f'{{"event_id": "e{n + 1}", "amount": {n}}}\\n')
    >>> proof = prove(pipeline, crash_at=["after-sink-commit"])
    >>> [(crash.point, crash.facts["sink_has_batch"], crash.facts["checkpoint_committed"]) for crash in proof.crashes]
    [('after-sink-commit', True, False)]
    >>> [(report.source_records, report.sink_records, report.quarantined, report.ok) for report in verify(pipeline)]
    [(4, 3, 1, True)]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamproof.api import Pipeline, prove, run, verify
    from streamproof.harness.proof import Proof
    from streamproof.pipeline.events import RunSummary
    from streamproof.reconcile import Report
    from streamproof.your_code.steps import this_batch

__version__ = "0.1.0"
__all__ = ["Pipeline", "Proof", "Report", "RunSummary", "prove", "run", "this_batch", "verify"]

# Every room is a module of this package, so any `import streamproof.<room>` runs this file first: PySpark's Python
# workers unpickling a sink's task, pytest loading the plugin in every run, each `streamproof` command. Importing the
# face with it would bring every room (Spark, Delta, Kafka, PostgreSQL clients) along each time: 0.8-1.1 s for
# `python -c "import streamproof.errors"` against 0.02-0.08 s without (measured; docs/architecture.md). So the face's
# names are resolved on first use, from this table (PEP 562).
_FACE = {
    "Pipeline": "streamproof.api",
    "prove": "streamproof.api",
    "run": "streamproof.api",
    "verify": "streamproof.api",
    "Proof": "streamproof.harness.proof",
    "Report": "streamproof.reconcile",
    "RunSummary": "streamproof.pipeline.events",
    "this_batch": "streamproof.your_code.steps",
}


def __getattr__(name: str) -> Any:
    if name in _FACE:
        return getattr(importlib.import_module(_FACE[name]), name)
    raise AttributeError(f"module 'streamproof' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
