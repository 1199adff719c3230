"""The core: source locations, errors, logs, structures of values, the graph IR and its passes. No
DALI here."""
