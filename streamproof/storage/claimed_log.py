"""A small record that a run rewrites, kept so that a run which lost its lease cannot write over the run that took
over: a log of entries ``<n:020d>.json``, each created only if absent (:meth:`Location.create_new`: a hard link on
local disk, a rename that never overwrites on HDFS, If-None-Match on S3), the newest one the record.

A run claims the log for its lease (:meth:`ClaimedLog.claim`, an entry naming it) before its first write. A run
paused past its lease and woken after another took over then either finds the newer lease in the newest entry, or
loses the race for the next entry's name: it writes nothing, and stops in one line. Users: the lookup versions
(:class:`streamproof.your_code.transform.LookupVersions`) and the quarantine mark
(:class:`streamproof.checkpoint.marks.QuarantineMark`); their tests try a woken run both ways.

>>> import tempfile
>>> log = ClaimedLog(Location(tempfile.mkdtemp()) / "marks", "the quarantine mark")
>>> log.claim("a" * 32, lambda: log.newest_record({}))
>>> number, record = log.newest_record({})
>>> log.append(number, {"batch": 4}, read=record)
>>> log.newest_record({})
(1, {'batch': 4, 'holder': 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'})
>>> taker = ClaimedLog(log.folder, "the quarantine mark")
>>> taker.claim("b" * 32, lambda: taker.newest_record({}))
>>> log.append(number + 1, {"batch": 5}, read=record)  # read before the taker's claim: its entry's name is taken
Traceback (most recent call last):
...
streamproof.errors.PipelineError: this run lost its lease: ... (lease bbbbbbbb) since this one's start; ...
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from streamproof.errors import PipelineError
from streamproof.storage.location import Location

Record = dict[str, Any]


class ClaimedLog:
    """The log in ``folder``; ``what`` names the record in errors ("the lookup versions"). ``KEPT`` entries are kept:
    each new entry deletes the one that falls out, so a store never lists more than that."""

    KEPT = 10

    def __init__(self, folder: Location, what: str) -> None:
        self.folder = folder
        self.what = what
        self.holder = ""  # the lease this run holds (:meth:`claim`); "" writes unclaimed

    def entry(self, number: int) -> Location:
        return self.folder / f"{number:020d}.json"

    def numbers(self) -> list[int]:
        """The entries' numbers, oldest first."""
        names = self.folder.names()
        return sorted(int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit())

    def newest_text(self) -> tuple[int, str | None]:
        """The newest entry's number and text; ``(-1, None)`` before the first entry."""
        numbers = self.numbers()
        if not numbers:
            return -1, None
        try:
            return numbers[-1], self.entry(numbers[-1]).read_text()
        except FileNotFoundError:  # listed, then gone: entries are never deleted from the newest end
            raise PipelineError(
                f"{self.entry(numbers[-1])} was deleted: restore {self.folder} from a checkpoint backup"
            ) from None

    def newest_record(self, empty: Record) -> tuple[int, Record]:
        """The newest entry's number and record (``(-1, empty)`` before the first); a damaged entry stops in one
        line, never read as no record (which would turn off what the record checks)."""
        number, text = self.newest_text()
        if text is None:
            return -1, empty
        return number, self.parse(self.entry(number), text)

    def parse(self, source: Location, text: str) -> Record:
        try:
            record = json.loads(text)
            assert isinstance(record, dict)
        except (ValueError, AssertionError):
            raise self.damaged(source, text) from None
        return record

    def damaged(self, source: Location, text: str) -> PipelineError:
        return PipelineError(
            f"{source} is damaged ({text[:40]!r} is not a record): it holds {self.what}; restore {self.folder} from "
            "a checkpoint backup"
        )

    def claim(self, holder: str, newest: Callable[[], tuple[int, Record]]) -> None:
        """Claim the log for the lease ``holder``: an entry naming it, holding the record ``newest()`` gives (which
        may come from an older file the log replaces). From here on an entry of another lease means this run lost
        its own. A woken older run's entry made between this run's read and its create is claimed after."""
        self.holder = holder
        tries = 3 if holder else 0
        for attempt in range(1, tries + 1):
            number, record = newest()
            try:
                return self.append(number, record)
            except PipelineError:
                if attempt == tries:
                    raise

    def append(self, newest: int, record: Record, read: Record | None = None) -> None:
        """The log's entry after ``newest``: ``record`` with this run's lease in it, created only if no other run
        made it. When the entry ``read`` (the newest, which ``record`` changes) names another lease, that run claimed
        the log after this one did, and this run writes nothing."""
        written = (read or {}).get("holder", "")
        if self.holder and written and written != self.holder:
            raise self.lost(written)
        self.folder.mkdir()
        if not self.entry(newest + 1).create_new(json.dumps({**record, "holder": self.holder})):
            raise self.lost(self.newest_record({})[1].get("holder", ""))
        # A run paused while another made KEPT entries or more finds the name free (pruned): its entry is not the
        # newest, which readers take; it lost all the same.
        if self.numbers()[-1] != newest + 1:
            raise self.lost(self.newest_record({})[1].get("holder", ""))
        self.entry(newest + 1 - self.KEPT).delete()  # entries are numbered on: one falls out

    def lost(self, other: str) -> PipelineError:
        return PipelineError(
            f"this run lost its lease: {self.folder} ({self.what}) was written by another run (lease "
            f"{other[:8] or 'unknown'}) since this one's start; it stops before its next commit"
        )
