"""The release this code is: the package face re-exports it for applications
(`pgworkerd.__version__`); the daemon names it in its registry row and its metrics from
here, so that no part of the package takes a name from the face. It is the one place the
version is declared: pyproject.toml reads it at build time (`dynamic = ["version"]`), and
`pgworkerd --version` prints it (not the installed metadata, which an editable install
freezes at install time)."""

__version__ = "0.3.0.dev0"
