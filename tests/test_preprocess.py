"""The data stage calls verl's preprocessing scripts with the options of the spec's release.

verl 0.3-0.5's gsm8k.py and math_dataset.py take `--local_dir` only; 0.6.0 added `--local_save_dir` (and
`--local_dataset_path`). The scripts of the releases in ../shared/verl-examples/ are run here: their own
argument parser (the statements of their `__main__` block up to `parse_args`) parses the arguments the
bundle passes. Releases whose scripts are not there are checked against the fact in compiler/verl/.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import tarfile
from pathlib import Path

import pytest

from conftest import IN_CI, REPO, slurm_job
from test_hostile import BASE
from test_hostile import build as build_for_targets
from verlc.compiler.verl import preprocess
from verlc.compiler.verl.release import RELEASES

EXAMPLES = REPO.parent / "shared" / "verl-examples"
SCRIPTS = {"gsm8k": "examples/data_preprocess/gsm8k.py", "math": "examples/data_preprocess/math_dataset.py"}


def release_scripts() -> dict[str, dict[str, str]]:
    """release -> dataset -> the text of that release's own preprocessing script, from ../shared."""
    found: dict[str, dict[str, str]] = {}
    for archive in sorted(EXAMPLES.glob("verl-v*-examples.tar.gz")):
        version = archive.name.removeprefix("verl-v").removesuffix("-examples.tar.gz")
        with tarfile.open(archive) as tar:
            found[version] = {dataset: tar.extractfile(path).read().decode()  # type: ignore[union-attr]
                              for dataset, path in SCRIPTS.items()}
    return found


def own_parser(script: str) -> argparse.ArgumentParser:
    """The script's own ArgumentParser: the statements of its `__main__` block before `parse_args`, run."""
    tree = ast.parse(script)
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    body = []
    for statement in main.body:
        if "parse_args" in ast.unparse(statement):
            break
        body.append(statement)
    scope: dict = {"argparse": argparse}
    exec(compile(ast.Module(body=body, type_ignores=[]), "<parser>", "exec"), scope)  # noqa: S102 - verl's own code
    return scope["parser"]


def spec(version: str, **prepare: str) -> dict:
    out = copy.deepcopy(BASE)
    out["verl_version"] = version
    out["data"]["prepare"] = [{"dataset": "gsm8k", "dir": "data/gsm8k", **prepare},
                              {"dataset": "math", "dir": "data/math", **prepare}]
    return out


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_gets_the_output_option_its_scripts_take(tmp_path: Path, version: str) -> None:
    ir, bundles = build_for_targets(tmp_path, spec(version), ("slurm", "ray-job"))
    expected = "--local_dir" if tuple(map(int, version.split(".")[:2])) < (0, 6) else "--local_save_dir"
    for step, dataset in zip(ir.data_prep, ("gsm8k", "math")):
        assert step.argv == ("python3", SCRIPTS[dataset], expected, f"data/{dataset}")
    script = next(f.text for f in bundles[0].files if f.path == "sbatch.sh")
    assert slurm_job(script)["data_prep"][0]["argv"][2:] == [expected, "data/gsm8k"]
    ray_job = next(b for b in bundles if b.target == "ray-job")
    job = json.loads(next(f.text for f in ray_job.files if f.path == "verlc_job/job.json"))
    assert job["data_prep"][0]["argv"][2:] == [expected, "data/gsm8k"]


def test_the_releases_own_scripts_parse_what_the_bundle_passes(tmp_path: Path) -> None:
    scripts = release_scripts()
    if not scripts:
        message = f"no verl example scripts in {EXAMPLES} (the shared folder beside the repository)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    for version, texts in scripts.items():
        ir, _ = build_for_targets(tmp_path, spec(version, local_dataset_path="/raw/ds"), ("slurm",))
        for step in ir.data_prep:
            args = own_parser(texts[step.dataset]).parse_args(list(step.argv[2:]))  # SystemExit on an unknown option
            saved = vars(args).get("local_save_dir") if "--local_save_dir" in step.argv else args.local_dir
            assert saved == step.out_dir, (version, step.argv)
            assert args.local_dataset_path == "/raw/ds"
        # The fact verlc keeps for this release agrees with what the script itself declares.
        declared = {a for action in own_parser(texts["gsm8k"])._actions for a in action.option_strings}
        options = preprocess.options(version)
        assert options.out_dir in declared and options.local_dataset in declared


def test_a_local_dataset_on_a_release_whose_scripts_read_only_the_hub_is_refused(tmp_path: Path) -> None:
    problems = build_for_targets(tmp_path, spec("0.4.1", local_dataset_path="/raw/ds"), ("slurm",))
    assert isinstance(problems, list)
    assert any("data.prepare[0].local_dataset_path: verl 0.4.1's preprocessing scripts read the dataset from the "
               "hub only" in p for p in problems), problems
    own = spec("0.4.1", local_dataset_path="/raw/ds", script="prep.py")  # a script of the user's: passed on
    ir, _ = build_for_targets(tmp_path, own, ("slurm",))
    assert ir.data_prep[0].argv == ("python3", "prep.py", "--local_dir", "data/gsm8k", "--local_dataset_path", "/raw/ds")
