"""Spark's streaming checkpoint, as streamproof reads, guards and repairs it.

* :mod:`~streamproof.checkpoint.log`: Spark's offset and commit logs (which batches are logged, committed,
  in flight; their offsets and watermarks);
* :mod:`~streamproof.checkpoint.folder`: the run lock, at-most-once's progress file, backup and restore;
* :mod:`~streamproof.checkpoint.recover`: the checkpoint against the sinks' own records: a lost checkpoint
  refused, and rebuilt from the offsets the sinks recorded.
"""
