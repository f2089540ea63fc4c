"""The JVM streamproof runs on: its jars, resolved with Maven once at set-up (:mod:`.jars`), the Spark session built on
them (:mod:`.session`), and the class-data archive that makes each later JVM start faster (:mod:`.archive`)."""
