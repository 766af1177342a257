"""The release this code is: the package face re-exports it for applications
(`pgworkerd.__version__`); the daemon names it in its registry row and its metrics from
here, so that no part of the package takes a name from the face. pyproject.toml's
`version` says the same."""

__version__ = "0.3.0.dev0"
