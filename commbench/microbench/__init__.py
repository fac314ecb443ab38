"""`commbench microbench`: communication-only size sweeps, nccl-tests style. The
command (command), the timed loop shared by every op (harness), one file per op with
its raw contenders (ops), and the result files (results)."""
