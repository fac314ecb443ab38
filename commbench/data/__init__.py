"""What a run trains on (`--data`): the fixed synthetic batch of the speed benchmarks,
or data a model can learn from — a classification task generated from a seed
(learnable), a generated language, text or images on disk — split among the workers
(`--partition`) and served batch by batch."""
