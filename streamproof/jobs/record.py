"""What a run of a job under streamproof did, kept as it happens: its queries (their sinks, checkpoints and plans), the
places it wrote, what streamproof changed, and the job's own error if it failed.

The run (:mod:`streamproof.jobs.child`) rewrites ``record.json`` in its state folder at every change, whole and by
rename, so a run killed by SIGKILL leaves the record of what it had started; the proof reads it after each run, and
``verify`` reads the one ``run`` left.

Example::

    >>> record = JobRecord(job="orders_job.py", digest="ab" * 32)
    >>> query = record.query_started(QueryRecord(label="orders", order=1, sink="delta"))
    >>> record.wrote("s3://prod/delta/orders", "/tmp/p/delta/orders", "delta", "orders")
    >>> JobRecord.from_dict(record.to_dict()).outputs["s3://prod/delta/orders"].format
    'delta'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

RECORD_FILE = "record.json"
OUTPUTS_FOLDER = "outputs"  # what the job's tasks wrote, noted by each (a worker cannot write the record itself)


@dataclass
class QueryRecord:
    """One streaming query the job started, in the order it started it."""

    label: str  # its queryName, or "query <order>"
    order: int
    sink: str  # Spark's sink format (delta, parquet, kafka, ...), or foreachBatch / foreach
    address: str | None = None  # where the job's own code says it writes (a path, a table, a topic), as written
    location: str | None = None  # where it writes in this run
    table: str | None = None  # toTable's table, when it writes one
    checkpoint_address: str | None = None
    checkpoint: str | None = None  # where its checkpoint is in this run
    function: str | None = None  # foreachBatch's function, foreach's writer
    source: dict[str, Any] = field(default_factory=dict)  # format, topics (as written and mapped), servers
    left_out: dict[str, str] = field(default_factory=dict)  # column -> why it differs from run to run
    unknown: list[str] = field(default_factory=list)  # why no verdict can be ok (nondeterminism decides rows)
    stateful: list[str] = field(default_factory=list)  # operators whose rows depend on how batches were cut
    trigger: str = ""  # the job's own trigger, as it set it
    query_id: str | None = None
    run_id: str | None = None
    moments: list[str] = field(default_factory=list)  # the durable steps of its write, learned from a clean batch


@dataclass
class Output:
    """A place the job wrote: what it named it (the key), where it is in this run, its format, and the query."""

    location: str
    format: str  # delta, parquet (json, csv, orc, text), kafka, postgresql, table
    query: str | None = None


@dataclass
class JobRecord:
    """The record of one run of a job (see the module)."""

    job: str
    digest: str
    argv: list[str] = field(default_factory=list)
    maps: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)  # the job's session settings the run could not take
    queries: list[QueryRecord] = field(default_factory=list)
    outputs: dict[str, Output] = field(default_factory=dict)
    tables: dict[str, str] = field(default_factory=dict)  # catalog tables the job made: name -> location
    topics: dict[str, dict[str, int]] = field(default_factory=dict)  # the topics read: their end offsets at the start
    error: str | None = None  # the job's own error, one line
    error_file: str | None = None  # its traceback
    path: str | None = None  # where the record is kept (not written)

    def query_started(self, query: QueryRecord) -> QueryRecord:
        self.queries.append(query)
        self.save()
        return query

    def wrote(self, address: str, location: str, format: str, query: str | None) -> None:
        """The job wrote ``address`` (at ``location`` in this run): a place the proof compares."""
        if address not in self.outputs:
            self.outputs[address] = Output(location, format, query)
            self.save()

    def changed(self, line: str) -> None:
        """streamproof changed one of the job's own choices for this run: said once, kept in order."""
        if line not in self.overrides:
            self.overrides.append(line)
            self.save()

    def failed(self, line: str, traceback_file: str | None) -> None:
        """The job's own error (the first one wins: the later ones follow from it)."""
        if self.error is None:
            self.error, self.error_file = line, traceback_file
            self.save()

    def save(self) -> None:
        if self.path is None:
            return
        target = Path(self.path)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(partial, target)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("path")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        known = {item.name for item in fields(cls)}
        record = cls(**{key: value for key, value in data.items() if key in known})
        record.queries = [QueryRecord(**query) for query in data.get("queries", [])]
        record.outputs = {address: Output(**output) for address, output in data.get("outputs", {}).items()}
        return record

    @classmethod
    def read(cls, folder: Path) -> JobRecord | None:
        """The record a run left in ``folder`` with the outputs its tasks noted beside it; None when it left none (it
        failed before the job ran)."""
        try:
            record = cls.from_dict(json.loads((folder / RECORD_FILE).read_text()))
        except (OSError, ValueError):
            return None
        for note in sorted((folder / OUTPUTS_FOLDER).glob("*.json")) if (folder / OUTPUTS_FOLDER).is_dir() else []:
            with contextlib.suppress(OSError, ValueError, TypeError):
                address, output = json.loads(note.read_text())
                record.outputs.setdefault(address, Output(**output))
        return record

    def query(self, label: str) -> QueryRecord | None:
        return next((query for query in self.queries if query.label == label), None)


def note_output(folder: Path, address: str, output: Output) -> None:
    """An output a task of the job wrote, noted beside the record (once per address, from any process)."""
    notes = folder / OUTPUTS_FOLDER
    target = notes / f"{hashlib.sha256(address.encode()).hexdigest()[:16]}.json"
    if target.exists():
        return
    notes.mkdir(parents=True, exist_ok=True)
    partial = notes / f".{target.name}.{os.getpid()}"
    partial.write_text(json.dumps([address, asdict(output)]))
    os.replace(partial, target)
