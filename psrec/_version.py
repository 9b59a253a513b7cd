"""The package version: the single source (``pyproject.toml`` reads it)."""

__version__ = "0.2.0"
