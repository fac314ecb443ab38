"""commbench: how distributed training scales under different communication strategies."""

__version__ = "0.1.0"
