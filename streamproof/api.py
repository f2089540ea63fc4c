"""The face for library use: :class:`Pipeline` and :func:`run`, :func:`verify`, :func:`prove` on it; imported as
``from streamproof import Pipeline, prove, run, verify`` (the example is in the package's docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from streamproof.config import PipelineSpec, dump_pipeline, load_pipeline
from streamproof.config.file import pipeline_from_tables
from streamproof.guarantees import Guarantee
from streamproof.harness.proof import Proof, prove_pipeline
from streamproof.jvm.session import build_session
from streamproof.pipeline.events import Event, RunSummary
from streamproof.pipeline.query import run as run_query
from streamproof.reconcile import Report, verify_pipeline
from streamproof.your_code.transform import function_name

Section = Mapping[str, Any]


class Pipeline:
    """A pipeline: the sections of a pipeline file (DESIGN.md) as keyword arguments, validated at once.

    Each section is what its table in the file holds, as a mapping (paths may be ``Path`` objects; relative
    ones are relative to the current directory). Your own transform is ``transform={..., "function": f}``, ``f``
    defined at the top level of a module (docs/your-code.md); ``lookups`` are the ``[[lookups]]`` tables. A
    mistake is a :class:`~streamproof.errors.ConfigError` with one
    line naming the key, as for a file.

    >>> Pipeline(name="p", source={"kind": "kafka", "topic": "t"}, transform={"schema": "id STRING"},
    ...          sink={"kind": "delta", "path": "/tmp/p", "mode": "apend"})
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: Pipeline(name='p'): sink.mode: 'apend' is not one of append, merge
    """

    def __init__(
        self,
        *,
        name: str,
        source: Section,
        transform: Section,
        sink: Section | None = None,
        sinks: Sequence[Section] = (),
        guarantee: Guarantee = "exactly-once",
        checkpoint: str | Path | None = None,
        trigger: Section | None = None,
        spark: Section | None = None,
        metrics: Section | None = None,
        retry: Section | None = None,
        lookups: Sequence[Section] = (),
    ) -> None:
        if "function" in transform:  # your own transform, given in Python: the processes streamproof runs import it
            transform = {
                **{k: v for k, v in transform.items() if k != "function"},
                "python": function_name(transform["function"]),
            }
        tables: dict[str, Any] = {"name": name, "guarantee": guarantee, "source": source, "transform": transform}
        optional = {
            "sink": sink,
            "sinks": list(sinks) or None,
            "checkpoint": checkpoint,
            "trigger": trigger,
            "spark": spark,
            "metrics": metrics,
            "retry": retry,
            "lookups": list(lookups) or None,
        }
        tables.update({key: value for key, value in optional.items() if value is not None})
        self.spec: PipelineSpec = pipeline_from_tables(tables, source_name=f"Pipeline(name={name!r})")
        self.file: Path | None = None

    @classmethod
    def load(cls, path: str | Path) -> Pipeline:
        """The pipeline of a pipeline file (relative paths in it are relative to the current directory).

        >>> Pipeline.load("no/such.toml")
        Traceback (most recent call last):
        ...
        streamproof.errors.ConfigError: no/such.toml: no such pipeline file
        """
        pipeline = cls.__new__(cls)
        pipeline.spec, pipeline.file = load_pipeline(path), Path(path)
        return pipeline

    @property
    def name(self) -> str:
        return self.spec.name

    def to_toml(self) -> str:
        """The pipeline as a pipeline file (absolute paths; secrets as their ``${VARIABLE}``)."""
        return dump_pipeline(self.spec)

    def save(self, path: str | Path) -> Path:
        """Write the pipeline file to ``path`` (what the crash harness runs); returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.to_toml(), encoding="utf-8")
        return target

    def __repr__(self) -> str:
        return f"Pipeline(name={self.name!r}, guarantee={self.spec.guarantee!r})"


def _spec(pipeline: Pipeline | str | Path) -> PipelineSpec:
    return pipeline.spec if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)


def run(
    pipeline: Pipeline | str | Path,
    *,
    available_now: bool = False,
    max_batches: int | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> RunSummary:
    """Run the pipeline in this process until drained (``available_now``), ``max_batches`` batches, or SIGTERM;
    ``on_event`` receives each batch's event (``print(event.line())`` shows what ``streamproof run`` prints).

    A restart resumes from the checkpoint. Example: see the module docstring.
    """
    return run_query(_spec(pipeline), available_now=available_now, max_batches=max_batches, on_event=on_event)


def verify(pipeline: Pipeline | str | Path, *, spark: SparkSession | None = None) -> list[Report]:
    """Reconcile the pipeline's source against each of its sinks, record by record: one report per sink.

    With ``spark`` the reconciliation runs in that session; otherwise in one built from the pipeline's ``[spark]``
    settings (the same process's, if one runs). Example: see the module docstring.
    """
    spec = _spec(pipeline)
    spark = spark or build_session(spec.spark, app_name=f"streamproof-verify:{spec.name}")
    return verify_pipeline(spark, spec)


def prove(
    pipeline: Pipeline | str | Path,
    *,
    crash_at: Sequence[str] = (),
    random_kills: int = 0,
    seed: int = 1,
    log_dir: str | Path | None = None,
    spark: SparkSession | None = None,
    emit: Callable[[str], None] = lambda line: None,
) -> Proof:
    """Run the pipeline as child processes, SIGKILL them at each of ``crash_at`` (``before-sink-write``,
    ``mid-sink-write``, ``after-sink-commit``, ``after-checkpoint-commit``; each in the second batch of a run) or
    ``random_kills`` times at seeded random moments, restart until drained, and reconcile every sink.

    ``log_dir`` (default: a folder beside the checkpoint) holds each run's logs; ``emit`` receives the harness's
    lines. The proof holds the crashes, with what each left on disk, and the reports. Example: see the module
    docstring.
    """
    spec = _spec(pipeline)
    beside = spec.checkpoint_dir.path.parent if not spec.checkpoint_dir.is_remote else Path(".streamproof/proofs")
    logs = Path(log_dir) if log_dir is not None else beside / f"{spec.checkpoint_dir.name}.proof"
    if isinstance(pipeline, Pipeline) and pipeline.file is not None:
        pipeline_file = pipeline.file
    elif isinstance(pipeline, Pipeline):
        pipeline_file = pipeline.save(logs / "pipeline.toml")
    else:
        pipeline_file = Path(pipeline)
    return prove_pipeline(
        pipeline_file, crash_at=crash_at, random_kills=random_kills, seed=seed, log_dir=logs, emit=emit, spark=spark
    )
