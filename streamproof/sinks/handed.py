"""Which batch streamproof handed to which of your own sinks, recorded outside the checkpoint, before your write is
called: ``<checkpoint>.streamproof/handed/<sink label>/<batch id>.json`` (:attr:`PipelineSpec.state_dir`).

Your sink (``kind = "python"``) keeps no record streamproof can read, so a lost, restored or recovered checkpoint
would hand it batch ids it was handed before, with other offsets, and a ledger keyed on the id would skip new records
or write old ones twice. The record beside the checkpoint survives all three: it holds the batch's id, its start and
end offsets and its key (:attr:`streamproof.your_code.steps.YourBatch.key`), and, once your write returned, says so. The
start checks read it as they read a sink's own commits (:class:`streamproof.sinks.python.PythonSink`): an empty
checkpoint while batches were handed out is refused, a batch id handed out with other offsets is refused, the batches
handed out beyond a restored checkpoint are replayed with their offsets, and ``checkpoint recover`` rebuilds from
them. Only the newest :data:`KEPT` batches are kept, as Spark keeps its offset log.

Example::

    >>> import tempfile
    >>> handed = HandedOut(Location(tempfile.mkdtemp()) / "orders.streamproof", "ledger")
    >>> [handed.hand(3, {"t": {"0": 10}}, {"t": {"0": 20}}, "orders:ab") for attempt in (1, 2)]
    [True, False]
    >>> handed.hand(3, {"t": {"0": 10}}, {"t": {"0": 25}}, "orders:cd")
    Traceback (most recent call last):
    ...
    streamproof.errors.PipelineError: your sink's batch 3 was handed out before with end offsets {"t": {"0": 20}} ...
    >>> handed.returned(3); [(record.batch_id, record.returned) for record in handed.records()]
    [(3, True)]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from streamproof.errors import PipelineError
from streamproof.storage.location import Location

Offsets = dict[str, dict[str, int]]
KEPT = 100  # the newest batches whose hand-outs are kept, per sink (Spark's offset log keeps as many)


@dataclass(frozen=True)
class HandOut:
    """One batch handed to your sink: its id, offsets and key, and whether your write of it returned."""

    batch_id: int
    start_offsets: Offsets | None
    end_offsets: Offsets
    key: str
    returned: bool = False

    def text(self) -> str:
        return json.dumps(
            {
                "batch_id": self.batch_id,
                "start_offsets": self.start_offsets,
                "end_offsets": self.end_offsets,
                "key": self.key,
                "returned": self.returned,
            }
        )


class HandedOut:
    """The hand-outs of one of your sinks (module docstring)."""

    def __init__(self, state_dir: Location, sink: str) -> None:
        self.folder = state_dir / "handed" / sink

    def _file(self, batch_id: int) -> Location:
        return self.folder / f"{batch_id}.json"

    def read(self, batch_id: int) -> HandOut | None:
        """The hand-out of ``batch_id``, None when it was not handed out (or is no longer kept)."""
        try:
            data = json.loads(self._file(batch_id).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            raise PipelineError(
                f"{self._file(batch_id)} is damaged: it records batch {batch_id} handed to your sink; "
                "restore it, or remove the folder to start the sink afresh"
            ) from None
        return _hand_out(data)

    def hand(self, batch_id: int, start: Offsets | None, end: Offsets, key: str) -> bool:
        """Record that ``batch_id`` with these offsets is handed to your write now; False when it was handed out before
        with the same offsets (a replay: until this write returns, not returned again). Another history's batch of that
        id is a :class:`PipelineError`."""
        record = HandOut(batch_id, start, end, key)
        if self._file(batch_id).create_new(record.text()):
            self._file(batch_id - KEPT).delete()
            return True
        before = self.read(batch_id)
        if before is not None and before.end_offsets != end:
            raise PipelineError(
                f"your sink's batch {batch_id} was handed out before with end offsets {json.dumps(before.end_offsets)} "
                f"(recorded in {self._file(batch_id)}) and the checkpoint now logs {json.dumps(end)} for it: the "
                "checkpoint is not the one your sink was written with; restore the checkpoint backup it was written "
                "with, or rebuild the checkpoint from the records (`streamproof checkpoint recover PIPELINE`)"
            )
        if before is not None and before.returned:  # a crash in this replay may leave it in part: handed, not done
            self._file(batch_id).replace_with_text(record.text())
        return False

    def returned(self, batch_id: int) -> None:
        """Your write of ``batch_id`` returned: the batch is written as far as your code is concerned."""
        record = self.read(batch_id)
        if record is not None and not record.returned:
            self._file(batch_id).replace_with_text(
                HandOut(record.batch_id, record.start_offsets, record.end_offsets, record.key, True).text()
            )

    def batch_ids(self) -> list[int]:
        """The batch ids whose hand-outs are kept, in order."""
        if not self.folder.exists():
            return []
        return sorted(
            int(name[: -len(".json")])
            for name in self.folder.names()
            if name.endswith(".json") and name[: -len(".json")].isdigit()
        )

    def records(self, first_batch: int = 0) -> list[HandOut]:
        """The hand-outs of batches ``>= first_batch``, in order."""
        found = (self.read(batch_id) for batch_id in self.batch_ids() if batch_id >= first_batch)
        return [record for record in found if record is not None]


def _hand_out(data: dict[str, Any]) -> HandOut:
    return HandOut(
        int(data["batch_id"]),
        data.get("start_offsets"),
        data["end_offsets"],
        str(data.get("key", "")),
        bool(data.get("returned")),
    )
