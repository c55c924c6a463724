"""Everything verlc knows about verl, below both the checks and the lowering.

- `release.py`: the releases verlc ships schemas for, and one release's facts (configs, dataclasses,
  closed value sets) loaded from `schemas/<version>.json.gz` or read from the installed verl;
- `extract.py`: reads those facts from a release's own files (dev/verl_schema.py, `--verl-config live`);
- `place.py`: where a dotted key lands in a release's config, and what verl builds there;
- `hydra.py`: verl's command line (Hydra override syntax);
- `check.py`: a spec's `verl:` section against one release; `rules.py`: verl's consistency rules.
"""
