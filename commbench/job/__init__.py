"""A job: `commbench run`'s flow, the one training step every strategy acts around, the
speed loop and the loop trained to accuracy, the compute-only reference, the recipe, the
models, and what rank 0 prints."""
