"""Your code, run as you wrote it: your modules shipped to the executors (:mod:`.modules`), your transform function
checked and run (:mod:`.transform`), and your own sink's write watched for the moments a proof crashes at
(:mod:`.calls` counts the durable calls, :mod:`.steps` numbers them)."""
