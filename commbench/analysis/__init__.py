"""From result files to answers: one reader for every kind of result (reader), the
data model that groups comparable runs (runs, accuracy), and the commands that use
them: `report` (tables), `compare` (A/B), `plot` (charts, drawn by commbench.plots).
Pure functions of the files; no torch."""
