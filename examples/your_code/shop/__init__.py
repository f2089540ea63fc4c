"""A shop's own PySpark, run and proven by streamproof: see orders.py and ../README.md."""
