"""Package discovery for the layout: the repository's top-level folders are one `verlc` package.

pyproject.toml maps each folder to its package (package-dir); setuptools finds every package below them,
so a new target folder (or any sub-package) ships without a line here.
"""

from setuptools import find_packages, setup

ROOTS = {"verlc": "verlc", "verlc.compiler": "compiler", "verlc.targets": "targets", "verlc.lifecycle": "lifecycle",
         "verlc.runtime": "runtime", "verlc.contract": "contract"}

setup(packages=[f"{name}.{sub}" if sub else name for name, folder in ROOTS.items()
                for sub in ("", *find_packages(folder))])
