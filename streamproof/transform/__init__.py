"""The transform: records parsed from the source's bytes (JSON or Avro, :mod:`.avro`), checked against the pipeline's
schema, and split into the valid rows and the quarantined ones, with the lineage columns every sink keeps
(:mod:`.records`)."""
