"""The compiled unit: a graph made runnable (build.py), the units a mode holds (unit.py) and the
one cache that holds them, with its limit, counters, miss explanation and the process's LRU of
live pipelines (cache.py). Every mode's front end hands its graphs here.
"""
