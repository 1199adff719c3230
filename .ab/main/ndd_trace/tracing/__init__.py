"""Tracing: user code runs on symbolic values and becomes a graph; guards key the cache; the step
check reads a generator's Python."""
