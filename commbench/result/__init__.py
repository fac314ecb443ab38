"""What a run leaves behind: result files (`store`), what a run records and writes
(`record`), every number defined once (`metrics`), and where it ran (`environment`)."""
