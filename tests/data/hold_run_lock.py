"""Holds a checkpoint's run lock as a pipeline run does (tests/test_lease.py): take it, then check it every 50 ms as
the batch path does before each write, for up to SECONDS. Prints ``held <epoch> <pid>`` once it holds the lock, and
``stopped: <the check's line>`` when the run lost it (exit 3); exit 2 with the refusal when it is held by another.

    python tests/data/hold_run_lock.py CHECKPOINT LEASE_S SECONDS
"""

import sys
import time

from streamproof.checkpoint.folder import RunLock
from streamproof.errors import PipelineError
from streamproof.storage.location import Location

checkpoint, lease_s, seconds = Location(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
try:
    lock = RunLock(checkpoint, lease_s=lease_s).__enter__()
except PipelineError as refused:
    print(f"refused: {refused}", flush=True)
    sys.exit(2)
assert lock.mine is not None
print(f"held {lock.mine.epoch} {lock.mine.pid}", flush=True)
code = 0
try:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lock.check()
        time.sleep(0.05)
except PipelineError as lost:
    print(f"stopped: {lost}", flush=True)
    code = 3
finally:
    lock.__exit__()
sys.exit(code)
