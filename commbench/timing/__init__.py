"""Where a step's time goes: the spans every rank records, their arithmetic, the split of
each step into its parts, clocks aligned to rank 0's, the GPU's kernel times, the
timeline file, and the bytes each piece put on the wire."""
