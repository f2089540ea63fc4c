"""The runs a nemesis drives (:mod:`streamproof.harness.nemesis`): its pipeline of its own (a matrix cell:
exactly-once, its own topic, checkpoint and sinks under its folder), the records produced into its topic before a
run, each run a child process (``streamproof run``) waited for to its end, and the commands of the CLI a step or a
repair calls. It also keeps the history: what each step really did, said as it happens.

The layers above it (the judgement of a run's exit, the steps, the nemesis that applies them) call it; it calls none
of them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from streamproof.config import KafkaSource, dump_pipeline, load_pipeline
from streamproof.errors import ConfigError
from streamproof.generator import generate
from streamproof.harness.child import PipelineChild
from streamproof.harness.crashes import Emit
from streamproof.harness.daemons import Daemons
from streamproof.harness.matrix import cell_spec, upstream_shares
from streamproof.harness.sequence import Step
from streamproof.storage.location import Location
from streamproof.transform.avro import avro_contract, with_subject_pinned
from streamproof.your_code.modules import importable_beside


class NemesisFailure(AssertionError):
    """A sequence ended in damage, a refusal the docs do not list for the state it met, or a failed run."""


@dataclass
class NemesisRuns:
    """A nemesis's pipeline of its own and its runs of it. Every field of a nemesis is here: the layers above (the
    judgement, the steps, :class:`~streamproof.harness.nemesis.Nemesis`) add methods and no field, so this dataclass's
    constructor is theirs, and a paused nemesis is written back field by field (:mod:`streamproof.harness.resume`)."""

    pipeline_file: Path
    workdir: Path
    spark: SparkSession
    daemons: Daemons
    data_seed: int
    emit: Emit = print
    label: str = "r"  # tells apart the topics of the sequences of one search
    records_per_step: int = 4_000
    batch: int = 1_000
    history: list[str] = field(default_factory=list)
    backups: list[Location] = field(default_factory=list)
    replaced: Location | None = None  # the checkpoint a restore replaced, which the pipeline last ran on (kept aside)
    replaced_at_run: int = -1  # how many runs there were then: a restore with none since keeps the earlier one's
    runs: int = 0
    produced: int = 0
    steps_applied: int = 0
    stamp: str = ""  # names its topic (and its folder on distributed storage); a resumed nemesis keeps its own
    _children: list[PipelineChild] = field(default_factory=list)  # the runs of the step in progress

    def __post_init__(self) -> None:
        spec = load_pipeline(self.pipeline_file)
        importable_beside(spec)  # your code beside the pipeline file: the sequences' files are elsewhere
        if spec.source.kind != "kafka":
            raise ConfigError(
                f"--nemesis produces its records into Kafka and needs a kafka source, not {spec.source.kind}"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stamp = stamp = self.stamp or f"{time.strftime('%Y%m%dT%H%M%S')}-{self.label}-{self.data_seed}"
        self.topic = f"{spec.source.topic}-nemesis-{stamp}"
        # On distributed storage the sequence's files live there, as the pipeline's do (its faults are that store's).
        parent = spec.checkpoint_dir.parent
        self.storage = parent / f"nemesis-{stamp}" if spec.on_distributed_storage else Location(self.workdir)
        cell = cell_spec(spec, "exactly-once", self.topic, self.storage, self.batch)
        self.spec = self.daemons.through_proxy(cell)
        self.cell_file = self.workdir / "pipeline.toml"
        self.cell_file.write_text(dump_pipeline(self.spec))
        self.shares = upstream_shares(spec, None, None)
        self.avro = avro_contract(with_subject_pinned(spec))
        self.checkpoint = self.spec.checkpoint_dir

    def _produce(self) -> None:
        self.produced += 1
        assert isinstance(self.spec.source, KafkaSource)
        generate(
            self.spec.source.bootstrap_servers,
            self.topic,
            self.records_per_step,
            partitions=4,
            malformed=0.005,
            seed=self.data_seed * 1000 + self.produced,
            avro=self.avro,
            duplicates=self.shares["duplicates"],
            late=self.shares["late"],
        )

    def _start(
        self, *, available_now: bool = True, host: str | None = None, environment: dict[str, str] | None = None
    ) -> PipelineChild:
        self.runs += 1
        child = PipelineChild(
            self.cell_file,
            self.workdir / "logs",
            name=f"run-{self.runs}" + (f"-{host}" if host else ""),
            available_now=available_now,
            host=host,
            environment=environment,
        )
        self._children.append(child)
        return child

    @staticmethod
    def _after_batches(child: PipelineChild, count: int) -> bool:
        """Wait for the run's ``count``-th batch; False when the run ended first."""
        deadline = time.monotonic() + 600
        while len(child.batches()) < count:
            if child.process.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _run_to_its_end(self) -> tuple[PipelineChild, int, str]:
        """A run to its end: the child, its exit code and its error line ("" when none)."""
        child = self._start()
        code = child.wait(900)
        child.close()
        return child, code, child.error_line() or ""

    def _cli(self, step: Step, *args: str) -> None:
        # A session of its own, as the runs have: a Ctrl-C meant to pause the nemesis must not cut a repair short.
        done = subprocess.run(
            [sys.executable, "-m", "streamproof", *args],
            capture_output=True,
            text=True,
            timeout=1800,
            start_new_session=True,
        )
        if done.returncode != 0:
            raise NemesisFailure(
                f"{step.encode()}: `streamproof {' '.join(args[:2])}` exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-600:]}"
            )

    def _failed(self, failure: NemesisFailure) -> None:
        """Said when it happens: a long search then shrinks for minutes before it prints the failure it found."""
        line = f"step {self.steps_applied} FAILED: {failure}"
        self.history.append(line)
        self.emit(line)

    def _say(self, step: Step, what: str) -> None:
        line = f"step {self.steps_applied} {step.encode()}: {what}"
        self.history.append(line)
        self.emit(line)

    def _say_if(self, step: Step, what: str) -> None:
        """:meth:`_say`, when there is something to say."""
        if what:
            self._say(step, what)
