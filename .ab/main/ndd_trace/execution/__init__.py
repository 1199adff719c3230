"""Execution: a lowered graph built into a DALI pipeline, fed, run and fetched; the eager
interpreter; the loader's waits.
"""
