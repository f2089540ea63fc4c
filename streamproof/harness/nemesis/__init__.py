"""The nemesis: a sequence of composed faults and operator actions on a live stream, then both checkers on every
sink (``streamproof prove PIPELINE --nemesis STEPS``; the sequences come from :mod:`streamproof.harness.search`).

Each step is one thing a user or the world does (Jepsen's nemesis, on streamproof's own commands); the table of them
stands in :mod:`~streamproof.harness.nemesis.steps`.

On S3 (``infra up --s3``) the sequence's checkpoint and tables live in the pipeline's bucket, and its runs reach the
store through a fault proxy (:mod:`streamproof.harness.daemons`).

Every step that runs the pipeline first produces new records into the topic (a live stream). After each step the
pipeline has carried on, or refused with a line the docs list for the state the step left (a lost checkpoint:
``checkpoint recover``; a sink behind: ``checkpoint rewind``), and the nemesis applies that repair; any other
refusal, or a run that fails, ends the sequence as a failure. At the end the topic is drained and every sink must be
0 lost / 0 duplicated / 0 unexpected by Spark's checker and by the independent one, which must agree.

A sequence (:mod:`streamproof.harness.sequence`: its steps, its text ``data=7,kill@2:0.41,backup,drain``, its plan
from a seed) is replayed exactly (``--nemesis-replay``); the moment of a kill within a batch stays approximate, and
each step prints what really happened.

The nemesis in layers, each standing on the one below and calling none above:

* :mod:`~streamproof.harness.nemesis.runs`: its pipeline of its own, the records produced into its topic, each run a
  child process to its end, the CLI's commands, the history;
* :mod:`~streamproof.harness.nemesis.judgement`: each run's exit judged, the refusals the docs list repaired, the
  verdict of both checkers;
* :mod:`~streamproof.harness.nemesis.steps`: the steps, one method each, and whether one applies;
* :class:`Nemesis`, here: a step applied (its records produced first, its failure said), and the end.

Example::

    >>> from streamproof.harness.sequence import parse_sequence
    >>> parse_sequence("data=7,kill@2:0.41,restore:0").steps
    [Step(action='kill', after=2, phase=0.41, index=0), Step(action='restore', after=1, phase=0.0, index=0)]
"""

from __future__ import annotations

from streamproof.errors import first_line
from streamproof.harness.nemesis.runs import NemesisFailure
from streamproof.harness.nemesis.steps import NemesisSteps
from streamproof.harness.sequence import RUNS, Step

__all__ = ["Nemesis", "NemesisFailure"]


class Nemesis(NemesisSteps):
    """Runs steps on one pipeline of its own (exactly-once, its own topic, checkpoint and sinks under ``workdir``,
    as a matrix cell), and judges the end. ``history`` holds what each step really did."""

    def apply(self, step: Step) -> None:
        """Run one step to its end (repairs included); :class:`NemesisFailure` when the pipeline misbehaved."""
        self.steps_applied += 1
        if not self.can(step.action):
            self._say(step, "not applicable now: skipped")
            return
        try:
            if step.action in RUNS:
                self._produce()
            getattr(self, "_" + step.action.replace("-", "_"))(step)
        except NemesisFailure as failure:
            self._failed(failure)
            raise
        except Exception as error:  # noqa: BLE001 - whatever broke, the sequence failed and is to be replayed
            broke = NemesisFailure(f"{step.encode()}: {type(error).__name__}: {first_line(error)}")
            self._failed(broke)
            raise broke from error
        finally:
            for child in self._children:  # a step that failed midway leaves no process behind, nor its scratch
                child.close()
            self._children.clear()

    def finish(self) -> list[str]:
        """Drain, then both checkers on every sink: the problems found (empty: every sink 0/0/0, checkers agree)."""
        self.apply(Step("drain"))
        return self._verdict()
