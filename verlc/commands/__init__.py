"""The commands of `verlc`, one module per group: build.py (build, validate, check, diff), runs.py (a run's
lifecycle) and verl.py (explain, migrate, schema, stage-in). verlc/cli.py dispatches to them by a table."""
