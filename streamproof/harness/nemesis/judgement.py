"""A nemesis's judgement of each run's exit (:mod:`streamproof.harness.nemesis`): a run that ended must have exited 0,
or refused with a line the docs list for the state the step left, and the repair that line names is applied; any
other exit ends the sequence as a :class:`~streamproof.harness.nemesis.runs.NemesisFailure`. At the end, the verdict:
both checkers on every sink.

It stands on the runs (:mod:`~streamproof.harness.nemesis.runs`) and calls no step: the steps stand on it.
"""

from __future__ import annotations

from streamproof.errors import log_tail
from streamproof.harness.child import PipelineChild
from streamproof.harness.nemesis.runs import NemesisFailure, NemesisRuns
from streamproof.harness.sequence import Step
from streamproof.reconcile import verify_pipeline
from streamproof.reconcile.independent import disagreements, verify_independently
from streamproof.sinks.base import TOO_OLD_REPAIR

# The refusals the docs list, by the damage a step left, and the command that repairs each.
REPAIRS = {"checkpoint-lost": "checkpoint recover", "sink-behind": "checkpoint rewind"}


class NemesisJudgement(NemesisRuns):
    """Each run's exit judged, the refusals the docs list repaired, and the verdict at the end."""

    def _ended(self, step: Step, child: PipelineChild, what: str) -> None:
        code = child.wait(900)
        child.close()
        self._say(step, f"{what}: {len(child.batches())} batches, exit {code} (run {self.runs})")
        self._judge_exit(step, child, code)

    def _judge_exit(self, step: Step, child: PipelineChild, code: int) -> None:
        if code == 0:
            return
        line = child.error_line()
        if self._put_back_if_too_old(step, code, line):
            # What the refused run was to read, read now as the drain step does (judged again: no second way back);
            # written out here because the judgement stands below the steps and calls none.
            self._ended(step, self._start(), "drained")
            return
        raise NemesisFailure(
            f"{step.encode()}: run {self.runs} exited {code} in a state the docs give no refusal "
            f"for: {line or log_tail(child.log_path)}"
        )

    def _put_back_if_too_old(self, step: Step, code: int, line: str | None) -> bool:
        """A backup restored further behind a sink than the offsets it keeps is refused, as the docs list; the operator
        puts back the checkpoint the restore replaced. True when that was the refusal, and it is repaired."""
        if code != 2 or line is None or TOO_OLD_REPAIR not in line or self.replaced is None:
            return False
        self._say(step, f"refused ({line[:100]}...); checkpoint restore of the checkpoint it replaced")
        self._cli(step, "checkpoint", "restore", str(self.cell_file), "--from", str(self.replaced))
        self.replaced.delete(recursive=True)
        self.replaced = None
        return True

    def _expect_refusal(self, step: Step, damage: str, carry_on_allowed: bool = False) -> None:
        """The next run must refuse with the line the docs list for ``damage`` (or, where allowed, carry on); the
        repair it names is then applied and must succeed. A too-old restore of an earlier step that no run has met
        yet is refused first (found at step 99 of a 200-step run): its repair is applied, then ``damage``'s is
        expected."""
        child, code, line = self._run_to_its_end()
        if self._put_back_if_too_old(step, code, line):
            child, code, line = self._run_to_its_end()
        repair = REPAIRS[damage]
        if code == 0 and carry_on_allowed:
            self._say(step, f"run {self.runs} carried on (replayed what the sink lost): exit 0")
            return
        if code != 2 or f"streamproof {repair}" not in line:
            raise NemesisFailure(
                f"{step.encode()}: after {damage}, run {self.runs} exited {code} without the refusal "
                f"naming `{repair}`: {line or log_tail(child.log_path)}"
            )
        self._say(step, f"refused ({line[:100]}...); {repair}")
        self._cli(step, *repair.split(), str(self.cell_file))

    def _verdict(self) -> list[str]:
        """Both checkers on every sink, and the end line said: the problems found (empty: all 0/0/0, they agree)."""
        reports = verify_pipeline(self.spark, self.spec)
        problems = [
            f"{report.sink}: lost {report.lost}, duplicated {report.duplicated}, unexpected "
            f"{report.unexpected} ({report.verdict})"
            for report in reports
            if not report.ok
        ]
        problems += disagreements(reports, verify_independently(self.spec))
        totals = ", ".join(f"{report.sink} {report.sink_records:,} rows" for report in reports)
        self.emit(
            f"end: {self.produced * self.records_per_step:,} records produced; {totals}; "
            + ("every sink 0/0/0, both checkers agree" if not problems else "; ".join(problems))
        )
        return problems
