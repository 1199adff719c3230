"""Known differences from eager ndd, found by differential sweeps and not fixed yet: each test is
a strict xfail, so it fails the suite once the difference is gone (then drop the mark, and keep
the case as a test of its behaviour's file).

None is known now: a variable scalar for `normalize(mean=...)` (eager's argument split, applied
to numbers too: tests/test_argument_split.py) and a failing op that failed every output of its
run (only the results that use it fail: tests/test_errors.py) were fixed (issue 35).
"""
