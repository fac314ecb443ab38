"""From result files to answers: the data model that groups comparable runs (runs),
and the commands that read it: `report` (tables), `compare` (A/B), `plot` (charts,
drawn by commbench.plots). Pure functions of the files; no torch."""
