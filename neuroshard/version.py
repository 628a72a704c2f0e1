"""The package version (also in pyproject.toml)."""
__version__ = "1.3.0"
