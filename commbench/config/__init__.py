"""Configuration and the command line: the run configuration (`run_config`), the shared
flag checks (`flags`), and what messages travel as (`compression`)."""
