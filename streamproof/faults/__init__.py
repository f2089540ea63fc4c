"""The faults a proof arms: crash points met in the driver, and processes found and SIGKILLed (:mod:`.points`), and
the faults met inside a write's Spark tasks on a cluster (:mod:`.in_tasks`)."""
