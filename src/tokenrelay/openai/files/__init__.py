"""`/v1/files`: the Batch API's input files and the files batches write."""
