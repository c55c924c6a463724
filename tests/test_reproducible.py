"""reproducible: true: what the spec must pin, and verl's determinism settings turned on."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from conftest import slurm_job
from test_hostile import BASE, build

DIGEST = "img@sha256:" + "ab" * 32
COMMIT = "0123456789abcdef" * 2 + "01234567"


def spec(**changes: object) -> dict:
    s = copy.deepcopy(BASE)
    s.update({"reproducible": True, "verl_version": "0.9.1", "model": {"path": "org/model", "revision": COMMIT}})
    s["container"] = {**s["container"], "image": DIGEST}
    s.update(changes)
    return s


def test_a_pinned_spec_turns_on_verls_determinism(tmp_path: Path) -> None:
    ir, _ = build(tmp_path, spec(), ("slurm", "ray-job"))
    args = set(ir.trainer_argv)
    for expected in ("data.seed=42", "actor_rollout_ref.rollout.seed=42", "actor_rollout_ref.rollout.full_determinism=true",
                     "actor_rollout_ref.actor.fsdp_config.full_determinism=true",
                     "actor_rollout_ref.ref.fsdp_config.full_determinism=true", "critic.fsdp.full_determinism=true"):
        assert expected in args
    assert "full_determinism: true" in ir.verl_config


def test_a_tag_is_not_a_pin(tmp_path: Path) -> None:
    problems = build(tmp_path, spec(container={**BASE["container"], "image": "img:latest"}))
    assert any("container.image: reproducible: true needs the image pinned by digest" in p for p in problems)


def test_an_image_file_is_pinned_by_its_own_sha256_and_runs_without_the_pin(tmp_path: Path) -> None:
    sha = "cd" * 32
    for runtime, file, registry in (("apptainer", "/images/verl.sif", "docker://ghcr.io/lab/verl:1"),
                                    ("pyxis", "/images/verl.sqsh", "nvcr.io#lab/verl:1")):
        container = {"runtime": runtime, "workdir": "/w"}
        problems = build(tmp_path, spec(container={**container, "image": file}))
        assert any(f"container.image: reproducible: true needs the image file pinned by its own sha256, which the "
                   f"job checks on every node: {file}@sha256:<the sha256sum of {file}>" in p for p in problems), problems
        problems = build(tmp_path, spec(container={**container, "image": registry}))
        assert any("needs the image pinned by digest" in p for p in problems), problems
        problems = build(tmp_path, spec(container={**container, "image": f"{file}@sha256:abc"}))
        assert any("container.image: an image file is pinned as FILE@sha256:<64 hex digits" in p
                   for p in problems), problems
        ir, _ = build(tmp_path, spec(container={**container, "image": f"{file}@sha256:{sha}"}), ("slurm",))
        assert (ir.container.image.parts, ir.container.image_sha256) == ((file,), sha)
        assert ir.image.parts == (f"{file}@sha256:{sha}",)  # the run record names the pinned image


def test_verl_version_must_be_written(tmp_path: Path) -> None:
    s = spec()
    del s["verl_version"]
    problems = build(tmp_path, s)
    assert any("reproducible: true needs verl_version (or verl_commit) written in the spec" in p for p in problems)


def test_determinism_cannot_be_turned_off(tmp_path: Path) -> None:
    s = spec()
    s["verl"] = copy.deepcopy(s["verl"])
    s["verl"]["actor_rollout_ref"]["rollout"]["full_determinism"] = False
    problems = build(tmp_path, s)
    assert any("rollout.full_determinism: set to false here, but reproducible: true needs it on" in p for p in problems)


def test_a_hub_model_must_be_pinned_to_its_commit(tmp_path: Path) -> None:
    problems = build(tmp_path, spec(model="org/model"))
    assert any(p.endswith(": model: reproducible: true needs the hub model pinned to its commit: model: {path: "
                          "org/model, revision: <40-hex commit sha>} (or a local folder: a path starting with / or ./)")
               for p in problems), problems
    problems = build(tmp_path, spec(model={"path": "org/model", "revision": "main"}))
    assert any("model.revision: reproducible: true needs the commit sha (40 hex digits), not 'main'" in p
               for p in problems), problems
    ir, _ = build(tmp_path, spec(model="/models/local-copy"))  # a local folder is what it is: hashed by the run
    assert "actor_rollout_ref.model.path=/models/local-copy" in ir.trainer_argv


def test_a_pinned_model_is_fetched_into_its_folder_and_verl_reads_that_folder(tmp_path: Path) -> None:
    ir, bundles = build(tmp_path, spec(), ("slurm", "ray-job"))
    folder = f"models/org--model-{COMMIT[:12]}"
    assert f"actor_rollout_ref.model.path={folder}" in ir.trainer_argv
    assert (ir.model_fetch.repo, ir.model_fetch.revision, ir.model_fetch.folder.display) == ("org/model", COMMIT, folder)
    script = next(f.text for f in bundles[0].files if f.path == "sbatch.sh")
    assert slurm_job(script)["model_fetch"] == {"repo": "org/model", "revision": COMMIT, "folder": [folder]}
    assert "VERLC_ACCEPT_CHANGES=1" in script.split("\n\n")[0]  # the header says how to accept a change
    job = json.loads(next(f.text for f in bundles[1].files if f.path.endswith("job.json")))
    assert job["model_fetch"] == {"repo": "org/model", "revision": COMMIT, "folder": [folder]}
    mine = spec(model={"path": "org/model", "revision": COMMIT, "local_dir": "/shared/models/m"})
    ir, _ = build(tmp_path, mine, ("slurm",))
    assert "actor_rollout_ref.model.path=/shared/models/m" in ir.trainer_argv
