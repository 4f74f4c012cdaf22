"""The prefetching multi-worker loader (see iobench.loader.source for the shard-source seam)."""
