"""Sinks: each writes one micro-batch and honours the pipeline's guarantee (DESIGN.md, layer 3)."""
