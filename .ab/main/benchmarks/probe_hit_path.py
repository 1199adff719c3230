"""The hit path of a compiled call: a 5-op compiled step called 400 times after a warm-up, its time a
step and a cProfile of those calls (the Python calls a call makes).

    PYTHONPATH=. python benchmarks/probe_hit_path.py
"""
import cProfile, pstats, sys, time
import numpy as np
import nvidia.dali.experimental.dynamic as ndd
import ndd_trace

def step(x):
    x = ndd.flip(x, horizontal=1)
    x = ndd.crop(x, crop=[28, 28])
    x = ndd.cast(x, dtype=ndd.float32)
    mirror = ndd.random.coin_flip(batch_size=8)
    return ndd.crop_mirror_normalize(x, mirror=mirror, dtype=ndd.float32, output_layout="CHW",
                                     mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375])

fast = ndd_trace.compile(step)
data = [ndd.as_batch([np.full((32, 32, 3), i + j, np.uint8) for j in range(8)], layout="HWC") for i in range(20)]
t = time.perf_counter(); out = fast(data[0]); np.asarray(out.torch()); print("first", time.perf_counter() - t)
for i in range(50):
    np.asarray(fast(data[i % 20]).torch())
N = 400
t = time.perf_counter()
for i in range(N):
    r = fast(data[i % 20]); np.asarray(r.torch())
print("per step ms", (time.perf_counter() - t) / N * 1000)
pr = cProfile.Profile(); pr.enable()
for i in range(N):
    r = fast(data[i % 20]); np.asarray(r.torch())
pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(18)
