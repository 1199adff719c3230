"""Audio-style 1-D ops on the CPU: preemphasis, spectrogram, mel filter bank, to_decibels."""

import numpy as np
from _common import digest

import nvidia.dali.experimental.dynamic as ndd

rng = np.random.default_rng(4)
for step in range(3):
    signals = ndd.as_batch([rng.standard_normal(4000).astype(np.float32) for _ in range(2)])
    emphasized = ndd.preemphasis_filter(signals)
    spectrum = ndd.spectrogram(emphasized, nfft=256, window_length=256, window_step=128)
    mel = ndd.mel_filter_bank(spectrum, sample_rate=16000, nfilter=20)
    db = ndd.to_decibels(mel, multiplier=10.0, cutoff_db=-80.0)
    digest(f"step {step}", db.torch(pad=True))
