"""verlc: a compiler from declarative verl experiment specs to runnable bundles."""

__version__ = "0.1.0"
