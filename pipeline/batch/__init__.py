"""raipack batch: a matrix of models x target profiles x recipe overrides, built as a graph of stage jobs
deduplicated by cache key and run on an executor (local processes, or a Ray cluster)."""
