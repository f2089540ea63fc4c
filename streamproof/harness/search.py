"""The nemesis's search: random sequences of its steps (:mod:`streamproof.harness.nemesis`) drawn by Hypothesis's
stateful testing, so that a failing sequence shrinks to a short one, printed as the command that replays it.

:class:`NemesisMachine` is a ``RuleBasedStateMachine`` whose one rule draws each step's action among those that apply
(a SIGKILL at a drawn moment, a SIGTERM, a standby's takeover, a broker or PostgreSQL restart, a backup, a restore
of an older backup, a lost checkpoint, a sink's lost commits, faults of a cluster's machines), each example runs on
a pipeline of its own (fresh topic, checkpoint and sinks),
and its teardown drains and asks both checkers. The first example is drawn from ``seed``, so a run is repeated by
its seed; a failure found is shrunk (each try reruns a shorter sequence from scratch: minutes each, bounded by
``shrink_minutes``) and the shortest failing sequence is printed as ``streamproof prove PIPELINE --nemesis-replay
'...'``.

Example::

    >>> outcome = search(Path("orders.toml"), steps=20, seed=3, spark=spark, workdir=Path("n"))   # doctest: +SKIP
    >>> outcome.ok, outcome.sequence                                                             # doctest: +SKIP
    (True, 'data=1838270,kill@2:0.41,backup,...')
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, assume, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from pyspark.sql import SparkSession

from streamproof.errors import first_line
from streamproof.harness.crashes import Emit
from streamproof.harness.nemesis import Daemons, Nemesis, NemesisFailure, Sequence, Step

# The actions a step draws from, simplest first: a failing sequence shrinks towards the front.
ORDER = ("drain", "term", "kill", "backup", "restore", "broker", "postgres", "lose-commits", "lose-checkpoint",
         "standby", "executor", "datanode")  # fmt: skip


@dataclass
class NemesisOutcome:
    """How a nemesis run ended: ``sequence`` is the last sequence run (the shortest failing one when ``failure``)."""

    sequence: str
    failure: str | None = None
    examples: int = 0
    history: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None


def replay(pipeline_file: Path, sequence: Sequence, *, spark: SparkSession, workdir: Path, daemons: Daemons,
           emit: Emit = print) -> NemesisOutcome:  # fmt: skip
    """Run one sequence exactly (``--nemesis-replay``), then drain and check; the outcome says what failed."""
    nemesis = Nemesis(pipeline_file, workdir, spark, daemons, sequence.data_seed, emit)
    try:
        for step in sequence.steps:
            nemesis.apply(step)
        problems = nemesis.finish()
    except NemesisFailure as failure:
        return NemesisOutcome(sequence.encode(), str(failure), 1, nemesis.history)
    return NemesisOutcome(sequence.encode(), "; ".join(problems) or None, 1, nemesis.history)


def search(pipeline_file: Path, *, steps: int, seed: int, spark: SparkSession, workdir: Path, daemons: Daemons,
           emit: Emit = print, shrink_minutes: float = 60.0) -> NemesisOutcome:  # fmt: skip
    """Run a random sequence of ``steps`` steps drawn from ``seed`` (and, while it fails, shorter ones: shrinking)."""
    outcome = NemesisOutcome("")
    examples = [0]

    def open_nemesis(data_seed: int) -> Nemesis:
        examples[0] += 1
        emit(f"── sequence {examples[0]} (data seed {data_seed}) ──")
        return Nemesis(pipeline_file, workdir / f"sequence-{examples[0]}", spark, daemons, data_seed, emit,
                       label=f"s{examples[0]}")  # fmt: skip

    def record(nemesis: Nemesis, steps_run: list[Step], failure: str | None) -> None:
        sequence = Sequence(nemesis.data_seed, steps_run).encode()
        if failure is None and outcome.failure is not None:
            return  # a shrink try that passed: the shortest failure found so far stays the answer
        if failure is not None and outcome.failure is not None and len(steps_run) > outcome.sequence.count(","):
            return
        outcome.sequence, outcome.failure, outcome.history = sequence, failure, list(nemesis.history)

    machine = _machine(open_nemesis, record)
    machine._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]  # what @seed(seed) sets
    # Each try of a shorter failing sequence reruns it from scratch for minutes: Hypothesis's own bound on shrinking
    # (5 minutes) would stop after one or two. The nemesis's bound is the caller's.
    hypothesis_bound, engine.MAX_SHRINKING_SECONDS = engine.MAX_SHRINKING_SECONDS, int(shrink_minutes * 60)
    nemesis_settings = settings(  # the first step of each sequence is its initialisation (its data seed)
        max_examples=1, stateful_step_count=steps + 1, deadline=None, database=None, derandomize=False,
        phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
        print_blob=False,
    )  # fmt: skip
    started = time.monotonic()
    try:
        run_state_machine_as_test(machine, settings=nemesis_settings)
    except NemesisFailure:
        pass  # the shortest failing sequence is in ``outcome``
    except Flaky as flaky:  # a shorter try failed, its rerun did not (a kill's moment is approximate): say so
        emit(f"Hypothesis: the shortest failing sequence did not fail again when rerun ({first_line(flaky)})")
    finally:
        engine.MAX_SHRINKING_SECONDS = hypothesis_bound
    outcome.examples = examples[0]
    emit(f"nemesis: {examples[0]} sequence(s) in {time.monotonic() - started:.0f} s")
    return outcome


def _machine(open_nemesis: Callable[[int], Nemesis],
             record: Callable[[Nemesis, list[Step], str | None], None]) -> type[RuleBasedStateMachine]:  # fmt: skip
    """The state machine class, bound to one search (Hypothesis builds a new instance per sequence)."""

    class NemesisMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.nemesis: Nemesis | None = None
            self.steps: list[Step] = []
            self.failed = False
            self.data_seed = 1  # set by start(), which Hypothesis runs first

        @initialize(data_seed=st.integers(min_value=0, max_value=2**31 - 1))
        def start(self, data_seed: int) -> None:
            # Hypothesis first runs the simplest sequence there is (the first rule, repeated): not a random one.
            assume(data_seed != 0)
            self.data_seed = data_seed

        def _opened(self) -> Nemesis:
            # Opened at the first step: Hypothesis also tries sequences of no step at all, which cost nothing then.
            if self.nemesis is None:
                self.nemesis = open_nemesis(self.data_seed)
            return self.nemesis

        def _step(self, step: Step) -> None:
            self._opened()
            assert self.nemesis is not None
            self.steps.append(step)
            try:
                self.nemesis.apply(step)
            except NemesisFailure as failure:
                self.failed = True
                record(self.nemesis, self.steps, str(failure))
                raise

        @rule(data=st.data())
        def step(self, data: st.DataObject) -> None:
            # One rule draws the action: with a rule per action, Hypothesis's swarm testing turns a random part of
            # them off for a whole sequence (a long run without a single restore, seen), which suits many short
            # sequences, not one long one. Actions nearer the front of ORDER are what a failing sequence shrinks to.
            nemesis = self._opened()
            action = data.draw(st.sampled_from([action for action in ORDER if nemesis.can(action)]), label="action")
            if action == "kill":
                after = data.draw(st.integers(1, 3), label="after")
                phase = data.draw(st.floats(0.0, 1.0, allow_nan=False), label="phase")
                self._step(Step("kill", after, round(phase, 2)))
            elif action == "term":
                self._step(Step("term", data.draw(st.integers(1, 3), label="after")))
            elif action in ("standby", "broker", "postgres"):
                self._step(Step(action, data.draw(st.integers(1, 2), label="after")))
            elif action == "restore":
                self._step(Step("restore", index=data.draw(st.integers(0, 7), label="which")))
            elif action == "lose-commits":
                self._step(Step("lose-commits", index=data.draw(st.integers(1, 2), label="count")))
            else:
                self._step(Step(action))

        def teardown(self) -> None:
            if self.nemesis is None or self.failed or not self.steps:
                return
            try:
                problems = self.nemesis.finish()
            except NemesisFailure as failure:
                problems = [str(failure)]
            record(self.nemesis, self.steps, "; ".join(problems) or None)
            if problems:
                raise NemesisFailure("; ".join(problems))

    return NemesisMachine
