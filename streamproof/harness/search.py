"""The nemesis's search: the sequence of its steps (:mod:`streamproof.harness.nemesis`) that a seed gives, run once;
a failing one is shortened, and printed as the command that replays it.

The sequence is drawn from ``seed`` before anything runs (:func:`streamproof.harness.sequence.plan`: each step's
action among those that apply in the plan's model of the pipeline's state), so the same seed gives the same
sequence, printed before its first step. It runs on a pipeline of its own (fresh topic, checkpoint and sinks), then
drains, and both checkers judge every sink. A failing sequence is shortened by removing steps (:func:`shorten`;
each try reruns a shorter sequence from scratch: minutes each, bounded by ``shrink_minutes``), and the shortest
failing sequence is printed as ``streamproof prove PIPELINE --nemesis-replay '...'``.

Hypothesis drew the sequences before (its stateful testing): each step's choice then read the live state, which a
kill's timing changes, so a seed did not fix a sequence; it ran a failing sequence a second time to confirm it; and
its shrinker, given 20 minutes of 4.5-minute tries on one failure, only replaced steps by simpler ones (a 12-step
failure stayed 12 steps). Removing steps is what makes a failing sequence short (docs/guarantees.md).

Example::

    >>> outcome = search(Path("orders.toml"), steps=20, seed=3, spark=spark, workdir=Path("n"))   # doctest: +SKIP
    >>> outcome.ok, outcome.sequence                                                             # doctest: +SKIP
    (True, 'data=1716563217,drain,kill@1:0.64,...')
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from streamproof.harness.crashes import Emit
from streamproof.harness.daemons import Daemons
from streamproof.harness.nemesis import Nemesis, NemesisFailure
from streamproof.harness.resume import save_paused
from streamproof.harness.sequence import Sequence, parse_sequence, plan


@dataclass
class NemesisOutcome:
    """How a nemesis run ended: ``sequence`` is the last sequence run (the shortest failing one when ``failure``)."""

    sequence: str
    failure: str | None = None
    examples: int = 0
    history: list[str] = field(default_factory=list)
    paused: Path | None = None  # paused between two steps (:mod:`streamproof.harness.resume`): its state file

    @property
    def ok(self) -> bool:
        return self.failure is None


def replay(
    pipeline_file: Path,
    sequence: Sequence,
    *,
    spark: SparkSession,
    workdir: Path,
    daemons: Daemons,
    emit: Emit = print,
    nemesis: Nemesis | None = None,
    start: int = 0,
    pause_requested: Callable[[], bool] = lambda: False,
) -> NemesisOutcome:
    """Run one sequence exactly (``--nemesis-replay``), then drain and check; the outcome says what failed.
    ``nemesis``: one already opened for this sequence (its data seed), or resumed at step ``start``. Once
    ``pause_requested()``, the sequence pauses before its next step (the outcome names the state it saved)."""
    nemesis = nemesis or Nemesis(pipeline_file, workdir, spark, daemons, sequence.data_seed, emit)
    try:
        for index in range(start, len(sequence.steps)):
            if pause_requested():
                saved = save_paused(nemesis, sequence, index, daemons.restartable())
                emit(f"nemesis: paused before step {index + 1} of {len(sequence.steps)}; its state is in {saved}")
                return NemesisOutcome(sequence.encode(), None, 1, nemesis.history, paused=saved)
            nemesis.apply(sequence.steps[index])
        problems = nemesis.finish()
    except NemesisFailure as failure:
        return NemesisOutcome(sequence.encode(), str(failure), 1, nemesis.history)
    return NemesisOutcome(sequence.encode(), "; ".join(problems) or None, 1, nemesis.history)


def search(
    pipeline_file: Path,
    *,
    steps: int,
    seed: int,
    spark: SparkSession,
    workdir: Path,
    daemons: Daemons,
    emit: Emit = print,
    shrink_minutes: float = 60.0,
    pause_requested: Callable[[], bool] = lambda: False,
) -> NemesisOutcome:
    """Run the sequence of ``steps`` steps that ``seed`` gives (:func:`streamproof.harness.sequence.plan`), once; while
    it fails, shorter ones (:func:`shorten`, within ``shrink_minutes``). It may pause between two steps, as
    :func:`replay`."""
    started = time.monotonic()
    examples = [1]
    data_seed = plan(seed, 0, lambda action: True).data_seed  # the plan's first draw, whatever its steps
    emit(f"── sequence 1 (data seed {data_seed}) ──")
    nemesis = Nemesis(pipeline_file, workdir / "sequence-1", spark, daemons, data_seed, emit, label="s1")
    sequence = plan(seed, steps, nemesis.supports)
    emit(f"the sequence of seed {seed}: {sequence.encode()}")
    outcome = replay(
        pipeline_file,
        sequence,
        spark=spark,
        workdir=workdir,
        daemons=daemons,
        emit=emit,
        nemesis=nemesis,
        pause_requested=pause_requested,
    )
    if outcome.paused is not None:
        return outcome
    if outcome.failure is not None and shrink_minutes > 0:
        deadline = time.monotonic() + shrink_minutes * 60

        def still_fails(shorter: Sequence) -> bool:
            examples[0] += 1
            emit(f"── sequence {examples[0]}: {len(shorter.steps)} of the steps ({shorter.encode()}) ──")
            tried = replay(
                pipeline_file,
                shorter,
                spark=spark,
                workdir=workdir / f"sequence-{examples[0]}",
                daemons=daemons,
                emit=emit,
            )
            if not tried.ok:
                outcome.sequence, outcome.failure, outcome.history = tried.sequence, tried.failure, tried.history
            return not tried.ok

        # A pause asked for meanwhile ends the shortening: the shortest failing sequence found so far is printed.
        shorten(parse_sequence(outcome.sequence), still_fails, lambda: time.monotonic() > deadline or pause_requested())
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
