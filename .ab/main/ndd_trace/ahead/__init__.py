"""Running ahead. Reader loops of transparent mode: readers read ahead in a pipeline of their own, and the
regions that consume their batches are run ahead of the script, speculatively and checked.

    for jpegs, labels in reader.next_epoch(batch_size=64):   # an unmodified script
        images = ndd.decoders.image(jpegs, device="gpu")      # recorded lazily (lazy.py)
        train(images.torch(), labels.torch())                 # was already run ahead

Under transparent mode, `reader.next_epoch(batch_size=...)` moves the reader's operator into a
pipeline of its own (the very operator instance eager ndd would run: the same samples in the
same order), which a worker thread keeps reading ahead, across epoch boundaries too. The epochs
it hands out are eager ones: as many batches, the shard advanced at the end, a `break` leaving
the rest of the stream for the next epoch.

A region (lazy.py) fed by reader batches is then run ahead. Once it was seen on three
consecutive batches of a reader with the same structure and random states drawn at a steady
stride, its next runs are launched on the batches read ahead, with states drawn from clones of
the generators at the predicted positions. When the script reaches the region, a launched run is
used only if what it was fed is identical to what the script's own calls produced (the same
reader batch object, bit-equal random states, equal constants); otherwise it is dropped and the
region runs as usual. Results are therefore always the plain run's; a loop that does not repeat
itself only loses the running ahead (a region that mostly misses is no longer tried).

The same streams and the same Speculator serve compiled functions called from an eager reader
loop (calls.run_call): a reader whose eager batches fed a compiled
function streams from its next step on (the rest of that epoch, then every later one), and the
function's calls run ahead by the same rules.

The modules: runahead.py (the rules), streams.py and stream_files.py (reader streams),
loop_epochs.py (the epochs a compiled loop opens), speculator.py (running ahead, by the rules)
and calls.py (compiled steps called from an eager loop, the readers' methods watched).
"""
