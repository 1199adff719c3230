# The types of `from ndd_trace import ndd`: DALI's dynamic mode (its own stub, whole) and
# ndd_trace's `compile` (ndd.py: at run time the module is DALI's, with `compile` set).
from nvidia.dali.experimental.dynamic import *  # noqa: F403
from ndd_trace.decorator import compile as compile
