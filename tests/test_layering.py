"""The layering docs/architecture.md states, read from the source with `ast`: every import (type-only ones
too), resolved to the verlc folder it names. The layers are the folders, with no exception for a file.

    runtime/    what runs on the cluster: nothing of verlc but itself (and only the standard library: it ships)
    compiler/   nothing of verlc but itself; it gets the targets as a Catalog (compiler/catalog.py) from the
                composition root
    contract/   the launcher interface: the compiler (the IR a launcher submits)
    targets/    the compiler, the runtime (its protocol and job), the launcher interface and itself
    lifecycle/  the compiler, the runtime's protocol, the launcher interface and itself; launchers are handed in
    verlc/      the composition root: everything
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from conftest import REPO

FOLDERS = {"compiler": "verlc.compiler", "targets": "verlc.targets", "lifecycle": "verlc.lifecycle", "verlc": "verlc",
           "runtime": "verlc.runtime", "contract": "verlc.contract"}


def module_of(path: Path) -> str:
    folder, *rest = path.relative_to(REPO).with_suffix("").parts
    parts = [FOLDERS[folder], *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The verlc modules `path` imports, absolute (`from ..targets import X` in compiler/ is verlc.targets.X)."""
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "verlc")
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if module.split(".")[0] == "verlc":
                found.update(f"{module}.{a.name}" for a in node.names)
    return found


def sources(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def layer(module: str) -> str:
    """verlc.compiler.x -> compiler, verlc.runtime.protocol.Job -> runtime; verlc.cli -> verlc."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS and parts[1] != "verlc" else "verlc"


ALLOWED = {
    "runtime": {"runtime"},
    "compiler": {"compiler"},
    "contract": {"compiler", "contract"},
    "targets": {"compiler", "runtime", "contract", "targets"},
    "lifecycle": {"compiler", "runtime", "contract", "lifecycle"},
}


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_imports_follow_the_layers(folder: str) -> None:
    assert sources(folder), f"no sources under {folder}/"
    wrong = [f"{p.relative_to(REPO)} imports {m}" for p in sources(folder) for m in sorted(imports(p))
             if layer(m) not in ALLOWED[folder]]
    assert not wrong, "\n".join(wrong)


def test_the_runtime_needs_only_the_standard_library() -> None:
    """It ships to every node and container as it is: an import outside the standard library is made where it is
    used, inside a function (ray, torch, pyarrow and transformers, which verl's images have), never at the top."""
    found = []
    for path in sources("runtime"):
        for node in ast.parse(path.read_text(), str(path)).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.name}: {n}" for n in names if n and n.split(".")[0] not in sys.stdlib_module_names]
    assert not found, found


def test_the_version_the_compiler_stamps_is_the_distributions() -> None:
    import tomllib

    from verlc.compiler.version import VERSION

    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"] == VERSION


def test_the_reader_sees_relative_imports_as_they_resolve(tmp_path: Path) -> None:
    """The check's own reading: a relative import two levels up from a target's folder is the compiler."""
    seen = imports(REPO / "targets" / "slurm" / "lower.py")
    assert "verlc.compiler.ir.JobIR" in seen and all(m.startswith("verlc.") for m in seen)
    assert layer("verlc.targets.slurm.view") == "targets" and layer("verlc.runtime.job.Job") == "runtime"


def test_no_target_is_named_outside_its_folder_in_the_compiler() -> None:
    """A target is one folder: the compiler does not branch on a target's name (the registry's Catalog
    tells it what it needs: sections, checks, lowering)."""
    names = ("slurm", "ray-job", "ray_job", "compose", "kuberay", "skypilot")
    found = []
    for path in sources("compiler"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and c.value in names
                                                     for c in [*node.comparators, node.left]):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found


def test_the_compiler_reads_no_targets_section_by_its_name() -> None:
    """What the compiler needs of a target's section (its checks, node words, time limit) it asks the Catalog;
    it never reads `spec.cluster.slurm`, `spec["kubernetes"]` or `.get("skypilot")` itself."""
    from verlc.targets import CATALOG

    names = {t.section.at[-1] for t in CATALOG.targets if t.section}
    assert names >= {"slurm", "kubernetes"}
    found = []
    for path in sources("compiler"):
        tree = ast.parse(path.read_text(), str(path))
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}  # a method: `composer.compose()`
        for node in ast.walk(tree):
            keys = []
            if isinstance(node, ast.Attribute) and id(node) not in called:
                keys = [node.attr]
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):  # import writes a section
                keys = [node.slice]
            elif isinstance(node, ast.Call) and (getattr(node.func, "attr", None) == "get"
                                                 or getattr(node.func, "id", None) == "getattr"):
                keys = node.args[:2]
            words = [k if isinstance(k, str) else k.value for k in keys
                     if isinstance(k, str) or (isinstance(k, ast.Constant) and isinstance(k.value, str))]
            if names & set(words):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found
