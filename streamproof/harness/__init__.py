"""The proof: crash a pipeline with real SIGKILLs, restart it until drained, reconcile.

* :mod:`~streamproof.harness.child`: one pipeline run as a child process (the harness prove, bench and the pytest
  plugin share): its events as they arrive, its whole process tree killed;
* :mod:`~streamproof.harness.crashes`: named crash points (your own sink's moments too), restarts, what each crash
  left; :mod:`~streamproof.harness.random_kills`: seeded kills at random moments;
* :mod:`~streamproof.harness.matrix`: every guarantee x every crash point, each cell run and reconciled;
* :mod:`~streamproof.harness.cells`: the damage each cell must show, and what it showed.
"""
