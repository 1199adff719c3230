"""The modes: compiled generators (loop), transparent mode (lazy) and per-sample functions."""
