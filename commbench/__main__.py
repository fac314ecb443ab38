"""`python -m commbench ...` is the `commbench` command (with no subcommand: `run`)."""

from commbench.cli import main

if __name__ == "__main__":
    main()
