"""Replayable sources: each yields a DataFrame carrying the source coordinates of every record."""
