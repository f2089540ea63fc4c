"""Every file operation streamproof performs itself, local or through Hadoop's FileSystem (HDFS, S3), with the
conditional and atomic writes its guarantees stand on (:mod:`.location`)."""
