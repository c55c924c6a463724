"""verlc: a compiler from declarative verl experiment specs to runnable bundles."""

from .compiler.version import VERSION as __version__  # noqa: F401 (the compiler stamps it)
