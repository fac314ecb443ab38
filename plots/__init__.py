"""Charts rendered from commbench result files."""
