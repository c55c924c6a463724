"""verlc's version, which the compiler stamps into every bundle it lowers (JobIR.verlc_version); the CLI's
`verlc --version` and `verlc.__version__` are this one. pyproject.toml's [project] version must equal it
(tests/test_layering.py checks)."""

VERSION = "0.1.0"
