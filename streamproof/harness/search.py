"""The nemesis's search: random sequences of its steps (:mod:`streamproof.harness.nemesis`) drawn by Hypothesis's
stateful testing; a failing sequence is shortened, and printed as the command that replays it.

:class:`NemesisMachine` is a ``RuleBasedStateMachine`` whose one rule draws each step's action among those that apply
(a SIGKILL at a drawn moment, a SIGTERM, a standby's takeover, a broker or PostgreSQL restart, a backup, a restore
of an older backup, a lost checkpoint, a sink's lost commits, faults of a cluster's machines), each example runs on
a pipeline of its own (fresh topic, checkpoint and sinks), and its teardown drains and asks both checkers. The first
example is drawn from ``seed``, so a run is repeated by its seed; a failing sequence is shortened by removing steps
(:func:`shorten`; each try reruns a shorter sequence from scratch: minutes each, bounded by ``shrink_minutes``), and
the shortest failing sequence is printed as ``streamproof prove PIPELINE --nemesis-replay '...'``.

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
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from pyspark.sql import SparkSession

from streamproof.errors import first_line
from streamproof.harness.crashes import Emit
from streamproof.harness.daemons import Daemons
from streamproof.harness.nemesis import OUTAGES, Nemesis, NemesisFailure, Sequence, Step, parse_sequence

# The actions a step draws from, simplest first: a failing sequence shrinks towards the front.
ORDER = ("drain", "term", "kill", "backup", "restore", "broker", "postgres", "s3-slow", "s3-reset", "s3",
         "lose-commits", "lose-checkpoint", "s3-multipart", "standby", "executor", "datanode")  # fmt: skip


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
    # Hypothesis draws the sequence; its own shrinker is not used: each try reruns a sequence from scratch for
    # minutes, and within 20 of them it only replaced steps by simpler ones (a 12-step failure stayed 12 steps).
    # Removing steps (:func:`shorten`) is what makes a failing sequence short.
    nemesis_settings = settings(  # the first step of each sequence is its initialisation (its data seed)
        max_examples=1, stateful_step_count=steps + 1, deadline=None, database=None, derandomize=False,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
        print_blob=False,
    )  # fmt: skip
    started = time.monotonic()
    try:
        run_state_machine_as_test(machine, settings=nemesis_settings)
    except NemesisFailure:
        pass  # the failing sequence is in ``outcome``
    except Flaky as flaky:  # the failing sequence did not fail again when rerun (a kill's moment is approximate)
        emit(f"Hypothesis: the failing sequence did not fail again when rerun ({first_line(flaky)})")
    if outcome.failure is not None and shrink_minutes > 0:
        deadline = time.monotonic() + shrink_minutes * 60

        def still_fails(shorter: Sequence) -> bool:
            examples[0] += 1
            emit(f"── sequence {examples[0]}: {len(shorter.steps)} of the steps ({shorter.encode()}) ──")
            tried = replay(pipeline_file, shorter, spark=spark, workdir=workdir / f"sequence-{examples[0]}",
                           daemons=daemons, emit=emit)  # fmt: skip
            if not tried.ok:
                outcome.sequence, outcome.failure, outcome.history = tried.sequence, tried.failure, tried.history
            return not tried.ok

        shorten(parse_sequence(outcome.sequence), still_fails, lambda: time.monotonic() > deadline)
    outcome.examples = examples[0]
    emit(f"nemesis: {examples[0]} sequence(s) in {time.monotonic() - started:.0f} s")
    return outcome


def shorten(sequence: Sequence, still_fails: Callable[[Sequence], bool], out_of_time: Callable[[], bool]) -> Sequence:
    """The shortest sequence found by removing steps from a failing one while it still fails: halves first, then
    quarters, down to single steps (delta debugging's chunk removal), until ``out_of_time()``. A step left without
    what it needs (a restore with no backup before it) is skipped when run, so every shorter sequence runs.

    >>> failing = parse_sequence("data=5,drain,kill@2:0.5,backup,term@1,drain,restore:0,broker@1")
    >>> needs = lambda s: "backup" in s.encode() and "restore" in s.encode() and "drain" in s.encode()
    >>> shorten(failing, needs, lambda: False).encode()
    'data=5,backup,drain,restore:0'
    """
    steps = list(sequence.steps)
    chunk = max(1, len(steps) // 2)
    while not out_of_time():
        start = 0
        while start < len(steps) and not out_of_time():
            shorter = steps[:start] + steps[start + chunk :]
            if shorter and still_fails(Sequence(sequence.data_seed, shorter)):
                steps = shorter  # the same place now holds the steps after the ones removed
            else:
                start += chunk
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)
    return Sequence(sequence.data_seed, steps)


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
            elif action in ("standby", *OUTAGES):
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
