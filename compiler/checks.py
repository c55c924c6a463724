"""Checks across fields that pydantic cannot express. Every problem is collected; none stops the others."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .diagnostics import Diagnostic, SpecError
from .derive import (
    HCCL_PORTS, checkpoint_dir, critic_in_use, derived, derived_environment, hccl_picks_ports, own_checkpoint_dir,
    rollout_pool, strings_in, variant_specs,
)
from .ir import parse_word
from .overrides import device_defaults, verl_values
from .load import Sourced
from .spec import Apptainer, Engine, NoContainer, PinnedModel, Pyxis, Spec, image_file, is_hub_id
from . import memory
from .verl import determinism, loadable, preprocess
from .verl.check import NOTE, Selection, Setting, check_groups, check_verl, select, settings, without_prefixes
from .services import (ROLLOUT_MEMORY, check_references, gpu_memory_problems, placement_problems, tool_config_problems,
                       wiring_problems, word_problems)
from .verl.hydra import SERVICE_REFERENCE, hydra_value, shown
from .verl.program import GENERATION_SERVER, RAY_PROGRAMS, TORCHRUN, own_config
from .verl.release import Release
from .verl.rules import Config
from .verl.workers import external_modules, with_external

if TYPE_CHECKING:
    from .catalog import Catalog

_SECRET_NAME = re.compile(r"(?i).*(_KEY|_TOKEN|_SECRET|PASSWORD|PASSWD).*")


def check(spec: Spec, sourced: Sourced, release: Release, catalog: Catalog, targets: Iterable[str] = (),
          max_variants: int = 1000, code: Path | None = None) -> tuple[Diagnostic, ...]:
    """Raise SpecError with every problem found in `spec` (positions from `sourced`); return the notes
    (what verlc could not check and why). `targets`: those built, whose own build checks run; `code`: the
    run's code folder, where verlc reads the modules the run's VERL_USE_EXTERNAL_MODULES names."""
    if "VERL_USE_EXTERNAL_MODULES" in spec.env:  # modules verl imports as it loads may add to its registries
        release = with_external(release, external_modules(str(spec.env["VERL_USE_EXTERNAL_MODULES"]), code))
    chosen = select(spec.verl, release, spec.hydra.config_name, spec.hydra.groups)
    group_errors, notes, unchecked = check_groups(dict(spec.hydra.groups), spec.hydra.searchpath, release, sourced,
                                                  chosen)
    unchecked += release.unchecked
    if isinstance(chosen, str):
        where = ("hydra", "config_name") if (spec.hydra.config_name or release.primary) not in release.configs \
            else ("verl", "model_engine")
        verl_problems: Iterable[Diagnostic] = [sourced.diagnostic(where, chosen)]
    elif spec.sweep is None:
        verl_problems = _check_verl(spec, sourced, chosen, unchecked)
    else:
        verl_problems = _sweep(spec, sourced, chosen, max_variants, unchecked)
    problems = [
        *group_errors,
        *_verl_section(spec, sourced, chosen),
        *verl_problems,
        *_words(spec, sourced),
        *_env(spec, sourced),
        *check_references(spec, sourced),
        *word_problems(spec, sourced),
        *placement_problems(spec, sourced),
        *wiring_problems(spec, sourced),
        *tool_config_problems(spec, sourced, chosen, code),
        *_loaded_names(spec, sourced, chosen, code),
        *gpu_memory_problems(spec, sourced, chosen),
        *_rollout_memory(spec, sourced, chosen),
        *_fits(spec, sourced, chosen, release),
        *_learns_nothing(spec, sourced, chosen),
        *_container(spec, sourced),
        *_ray(spec, sourced),
        *_data(spec, sourced),
        *_reproducible(spec, sourced, chosen),
        *_device(spec, sourced, chosen),
        *_stall_timeout(spec, sourced, chosen),
        *_tracker(spec, sourced, chosen),
        *(p for t in catalog.targets for p in t.check_section(spec, sourced)),
        *(_container_paths(spec, sourced) if any(catalog.get(t).runs_container
                                                 for t in targets or spec.targets or catalog.names) else ()),
        *(p for t in dict.fromkeys(targets) for p in catalog.get(t).check_build(spec, sourced, chosen)),
        *(_unbuilt_program(spec, sourced, release) if targets else ()),
        *_generation_output(spec, sourced, chosen),
    ]
    notes += [p for p in problems if p.message.startswith(NOTE)]
    problems = [p for p in problems if not p.message.startswith(NOTE)]
    if problems:
        raise SpecError(problems)
    return tuple(sorted(set(notes)))


def _rollout_memory(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    """The rollout engine takes gpu_memory_utilization as its share of each GPU's memory: vLLM's CacheConfig takes
    0 < share <= 1 (SGLang's mem_fraction_static, which verl passes it as, is a share too); verl's own config
    takes any float, and the engine refuses it once the model has loaded."""
    if isinstance(chosen, str):
        return
    given = next((s for s in settings(spec.verl, chosen.walker) if s.key == ROLLOUT_MEMORY), None)
    value = given.value if given is not None else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 < value <= 1:
        yield sourced.diagnostic(given.loc, f"{value:g}: the rollout engine takes {ROLLOUT_MEMORY} as its share of "
                                            f"each GPU's memory, more than 0 and at most 1 (vLLM refuses any other "
                                            f"value as it starts, after the queue and the model load)")


def _fits(spec: Spec, sourced: Sourced, chosen: Selection | str, release: Release) -> Iterator[Diagnostic]:
    """A PPO run whose predicted peak on a trainer GPU (compiler/memory.py) is more than the GPU has is refused at
    the setting that sizes that phase, with the numbers and settings that would fit; one within memory.NEAR of
    it gets a note. Where verlc cannot know the shape or the GPU, `verlc plan` says why, and nothing is checked."""
    if isinstance(chosen, str) or own_config(spec.program, release) or spec.program == GENERATION_SERVER:
        return
    config = Config(chosen.tree, verl_values(spec, chosen))
    found = memory.for_spec(spec, sourced, config)
    if found.bad_shape:
        yield sourced.diagnostic(("model_shape",), found.bad_shape)
    peak = found.peak
    if peak is None or found.gpu is None:
        return
    where = {s.key: s.loc for s in settings(spec.verl, chosen.walker)}
    crowded = memory.vllm_weights_over_share(config.get, found)
    if crowded:
        yield sourced.diagnostic(where.get(ROLLOUT_MEMORY, ("verl",)), crowded)
    origin = f"of the GPU's {memory.gib(found.gpu)} GiB ({found.gpu_origin}; the model from {found.shape_origin})"
    over = [p for p in found.phases if p.bytes > found.gpu]
    for phase in over:  # each at the setting that sizes it (no two phases share one)
        terms = "; ".join(f"{t.what} {memory.gib(t.bytes)}" for t in phase.terms)
        fixes = memory.fixes(spec, sourced, config, found, phase)
        fits = f"; it fits with {', or '.join(fixes)}" if fixes else ""
        if phase.bound:  # the responses' own lengths decide: a note, not a refusal
            yield sourced.diagnostic(where.get(phase.tipping, ("verl",)), (
                f"{NOTE}each trainer GPU needs up to {memory.gib(phase.bytes)} GiB in {phase.name}, {origin}, where "
                f"every sequence of a micro batch runs to max_prompt_length + max_response_length (with "
                f"use_remove_padding a micro batch holds its sequences' own lengths): {terms}; verl runs out of "
                f"GPU memory there if they do{fits} (verlc plan shows every phase)"))
            continue
        yield sourced.diagnostic(where.get(phase.tipping, ("verl",)), (
            f"each trainer GPU would need {memory.gib(phase.bytes)} GiB in {phase.name}, {origin}: "
            f"{terms}; verl runs out of GPU memory there{fits} (verlc plan shows every phase)"))
    if not over and peak.bytes > memory.NEAR * found.gpu:
        yield sourced.diagnostic(where.get(peak.tipping, ("verl",)), (
            f"{NOTE}the predicted peak on each trainer GPU is {memory.gib(peak.bytes)} GiB, in {peak.name}, {origin}: "
            f"within {100 - memory.NEAR * 100:g}% of it (verlc plan shows every phase)"))


# verl's advantage estimators that compare the responses to one prompt with each other (a group of rollout.n)
GROUP_ESTIMATORS = ("grpo", "grpo_passk", "grpo_vectorized", "rloo", "rloo_vectorized", "opo", "gdpo",
                    "reinforce_plus_plus_baseline")


def _learns_nothing(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    """Notes for a run that verl takes and that learns nothing, or not what its estimator means."""
    if isinstance(chosen, str):
        return
    config = Config(chosen.tree, verl_values(spec, chosen))
    where = {s.key: s.loc for s in settings(spec.verl, chosen.walker)}
    epochs = config.get("trainer.total_epochs")
    if epochs == 0 and not isinstance(epochs, bool) and config.get("trainer.total_training_steps") in (None, 0):
        yield sourced.diagnostic(where.get("trainer.total_epochs", ("verl",)), (
            f"{NOTE}trainer.total_epochs 0: verl's trainer runs no step (it loads the model, validates if asked, and "
            f"ends)"))
    estimator, n = config.get("algorithm.adv_estimator"), config.get("actor_rollout_ref.rollout.n")
    if estimator in GROUP_ESTIMATORS and n == 1 and not isinstance(n, bool):
        yield sourced.diagnostic(where.get("actor_rollout_ref.rollout.n", where.get("algorithm.adv_estimator",
                                                                                      ("verl",))), (
            f"{NOTE}{estimator} compares the rollout.n responses to each prompt with each other, and rollout.n is 1: "
            f"every group has one response, so no response is better than its group's (set rollout.n to the group "
            f"size, e.g. 5)"))


def _loaded_names(spec: Spec, sourced: Sourced, chosen: Selection | str, code: Path | None) -> Iterator[Diagnostic]:
    """The classes and functions verl imports by a name the spec's verl settings give (loadable.spec_names): the
    release ships each one of verl's, the run's code each of its own."""
    if isinstance(chosen, str):
        return
    where = {s.key: s.loc for s in settings(spec.verl, chosen.walker)}
    config = Config(chosen.tree, verl_values(spec, chosen))
    for key, name, what in loadable.spec_names(config.get):
        found = loadable.name_problem(name, what, chosen.release.loadable, code, chosen.release.label,
                                      loadable.releases_shipping)
        if found is not None:
            message, refused = found
            yield sourced.diagnostic(where.get(key, ("verl", *key.split("."))), message if refused else NOTE + message)
    if "VERL_USE_EXTERNAL_MODULES" in spec.env:
        return  # modules verl imports as it loads may register more
    for key, name, registry in loadable.registered_names(config.get):
        problem = loadable.registry_problem(name, registry, chosen.release.loadable, chosen.release.label)
        if problem is not None and key in where:  # verl's own defaults are its registries' own
            yield sourced.diagnostic(where[key], problem)


def _unbuilt_program(spec: Spec, sourced: Sourced, release: Release) -> Iterator[Diagnostic]:
    """verl's programs other than main_ppo (SFT, evaluation, generation) are checked against their own configs;
    the SFT programs build under torchrun (lower.launch), generation and evaluation as Ray drivers, the others
    not yet: their inputs are not the job verlc builds."""
    config = own_config(spec.program, release)
    if config is None:
        return
    if spec.program not in TORCHRUN and spec.program not in RAY_PROGRAMS:
        yield sourced.diagnostic(("program",), f"{spec.program} is one of verl's own programs (config {config}); "
                                               f"verlc checks its `verl:` settings against that config (`verlc "
                                               f"validate SPEC` without --target) but does not build a bundle for "
                                               f"it yet")


def _generation_output(spec: Spec, sourced: Sourced, chosen: Selection) -> Iterator[Diagnostic]:
    """verl's generation server writes its responses to data.output_path, a key its config (ppo_trainer) lacks:
    its Hydra takes the config without it, and the program fails only once it has generated every response."""
    if spec.program == GENERATION_SERVER and "data.output_path" not in verl_values(spec, chosen):
        yield sourced.diagnostic(("program",), f"{spec.program} writes its responses to data.output_path, which "
                                               f"{chosen.config} lacks (verl would fail once every response is "
                                               f"generated): add it with Hydra's '+', e.g. verl: {{+data: "
                                               f"{{output_path: gen/responses.parquet}}}}")


def _check_verl(spec: Spec, sourced: Sourced, chosen: Selection, unchecked: tuple[str, ...]) -> Iterator[Diagnostic]:
    found = derived(spec, chosen.tree)
    return check_verl(spec.verl, {d.key: d.value for d in found}, sourced, chosen,
                      {d.key: d.source for d in found}, critic_in_use(spec.verl, chosen.tree), unchecked)


def _rollout_pool(spec: Spec, sourced: Sourced, chosen: Selection) -> Iterator[Diagnostic]:
    """A program that gives the rollout GPUs of its own (its config has rollout.nnodes/n_gpus_per_node) shares
    each node between trainer and rollout: the spec says how many are the rollout's."""
    default = chosen.tree.get("rollout")
    if not (isinstance(default, dict) and "n_gpus_per_node" in default):
        return
    pool = rollout_pool(spec.verl)
    nodes, gpus = pool if pool else (None, None)
    if nodes is None or gpus is None:
        yield sourced.diagnostic(("verl",), (
            f"{chosen.config} gives the rollout GPUs of its own (rollout.n_gpus_per_node, default "
            f"{default['n_gpus_per_node']}, beside the trainer's): set verl.rollout.nnodes "
            f"({spec.cluster.nodes}: the run's nodes) and verl.rollout.n_gpus_per_node; the trainer gets the "
            f"rest of each node's {spec.cluster.gpus_per_node}"), at_key=True)
        return
    if nodes != spec.cluster.nodes:
        yield sourced.diagnostic(("verl", "rollout", "nnodes"), (
            f"the rollout shares the run's nodes with the trainer: rollout.nnodes must be cluster.nodes "
            f"({spec.cluster.nodes})"))
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 < gpus < spec.cluster.gpus_per_node:
        yield sourced.diagnostic(("verl", "rollout", "n_gpus_per_node"), (
            f"rollout.n_gpus_per_node must leave the trainer GPUs of each node: 1 to "
            f"{spec.cluster.gpus_per_node - 1} of cluster.gpus_per_node ({spec.cluster.gpus_per_node})"))


def _verl_section(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    if isinstance(chosen, str):
        return
    leaves = settings(spec.verl, chosen.walker)
    yield from _unspellable(leaves, sourced)
    given = {s.key: s for s in leaves}
    yield from _rollout_pool(spec, sourced, chosen)
    for d in derived(spec, chosen.tree):
        s = given.get(d.key)
        if s is not None and s.value != d.value:
            yield sourced.diagnostic(
                s.loc, f"set to {shown(s.value)} here, but verlc derives it from {d.source} "
                       f"({shown(d.value)}); remove it from verl: or change {d.source}")
    for s in leaves:
        for text in strings_in(s.value):
            if bare := _SHELL_VARIABLE.search(text):
                yield sourced.diagnostic(s.loc, (
                    f"{NOTE}{bare[0]} stays literal (neither Hydra nor verl expands shell variables): write "
                    f"${{oc.env:{bare[0][1:]}}} for the environment variable where verl runs"))
                break
    critic = spec.verl.get("critic")
    if isinstance(critic, dict) and critic and not critic_in_use(spec.verl, chosen.tree):
        yield sourced.diagnostic(("verl", "critic"),
                                 f"{NOTE}critic settings given, but the advantage estimator uses no critic "
                                 "(only gae does); remove verl.critic or set algorithm.adv_estimator: gae",
                                 at_key=True)


_SHELL_VARIABLE = re.compile(r"(?<!\$)\$[A-Za-z_][A-Za-z0-9_]*")


def _unspellable(leaves: Iterable[Setting], sourced: Sourced) -> Iterator[Diagnostic]:
    """Values Hydra's override syntax cannot carry (e.g. a mapping key such as '1x')."""
    for s in leaves:
        try:
            hydra_value(without_prefixes(s.value))
        except (TypeError, ValueError) as exc:
            yield sourced.diagnostic(s.loc, str(exc))


def _words(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    """Paths and env values may reference env vars of the node (`${env:NAME}`, ${HOME}, ${USER}, ~) and
    nothing else that would expand."""
    places: list[tuple[tuple[str | int, ...], str | None]] = [  # a service's address: services.py says why not
        (("env", name), value) for name, value in spec.env.items() if not SERVICE_REFERENCE.search(value)]
    places += [(("model",), spec.model_path)]
    places += [(("data", part, i), f) for part in ("train_files", "val_files")
               for i, f in enumerate(getattr(spec.data, part))]
    c = spec.container
    if isinstance(c, (Engine, Apptainer, Pyxis)):
        places += [(("container", "image"), c.image), (("container", "workdir"), c.workdir)]
        places += [(("container", "mounts", i), m) for i, m in enumerate(c.mounts)]
    if isinstance(c, Engine):
        places += [(("container", "run_args", i), a) for i, a in enumerate(c.run_args)]
        if c.build:
            places += [(("container", "build", "dockerfile"), c.build.dockerfile),
                       (("container", "build", "context"), c.build.context)]
    if isinstance(c, NoContainer):
        places += [(("container", "workdir"), c.workdir), (("container", "venv"), c.venv)]
    for loc, text in places:
        if text is None:
            continue
        try:
            parse_word(text)
        except ValueError as exc:
            yield sourced.diagnostic(loc, str(exc))


# The variables that choose a process's accelerators, which Ray sets for each of its workers.
VISIBLE_DEVICES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")


def _device_count(value: object) -> int | None:
    """How many devices a literal CUDA_VISIBLE_DEVICES-like value lists (None: one that expands on the node)."""
    text = str(value)
    return None if "$" in text else len([d for d in text.split(",") if d.strip()])


def _env(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    ours = {e.name: e.origin for e in derived_environment(spec)}
    for name in spec.env:
        if name in ours and name in HCCL_PORTS:
            yield sourced.diagnostic(("env", name), f"verlc gives {name} a range of the job's own block of ports "
                                                    f"(two jobs on a node never share one); the other value it takes "
                                                    f"is `auto` (HCCL picks its ports itself, as verl's runtime env "
                                                    f"asks)", at_key=True)
        elif name in ours:
            origin = ours[name]
            yield sourced.diagnostic(("env", name), f"verlc sets {name} " + (
                f"itself ({origin.removeprefix('verlc: ')})" if origin.startswith("verlc: ")
                else f"from {origin}; change it there instead"), at_key=True)
        elif name in VISIBLE_DEVICES and spec.program not in TORCHRUN \
                and (listed := _device_count(spec.env[name])) is not None and listed < spec.cluster.gpus_per_node:
            yield sourced.diagnostic(("env", name), (
                f"{name} lists {listed} device(s), fewer than the cluster.gpus_per_node "
                f"({spec.cluster.gpus_per_node}) each node gives Ray to assign: Ray hands its workers device numbers "
                f"that {name} hides, and verl's workers fail once they start. List {spec.cluster.gpus_per_node}, or "
                f"remove it (Ray sets {name} for each worker itself)"), at_key=True)
        elif hccl_picks_ports(spec, name):
            yield sourced.diagnostic(("env", name), f"{NOTE}{name}: auto: HCCL picks these ports itself, from the "
                                                    f"OS's ephemeral ports, which no job's block of ports reaches: "
                                                    f"verlc's port plan leaves them to it", at_key=True)
        elif name.startswith("VERLC_"):
            yield sourced.diagnostic(("env", name), f"{name}: VERLC_ variables are verlc's own, set by the bundle "
                                                    f"or by you where you submit it (e.g. VERLC_STOP_AFTER=preflight "
                                                    f"sbatch ...), never by the spec", at_key=True)
        elif name in spec.secrets:
            yield sourced.diagnostic(("env", name), f"{name} is listed in secrets; a secret has no value "
                                                    f"in the spec", at_key=True)
        elif _SECRET_NAME.fullmatch(name):
            yield sourced.diagnostic(
                ("env", name), f"{name} looks like a secret; never write its value in a spec: remove it "
                               f"from env, add `secrets: [{name}]` and export {name} where you submit",
                at_key=True)
    seen: set[str] = set()
    for i, name in enumerate(spec.secrets):
        if name in seen:
            yield sourced.diagnostic(("secrets", i), f"{name} is listed twice")
        seen.add(name)


def _container(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    c = spec.container
    if isinstance(c, Pyxis) and spec.cluster.accelerator != "cuda":
        yield sourced.diagnostic(("container", "runtime"), "pyxis/enroot exposes NVIDIA GPUs only; use docker, "
                                 f"podman or apptainer on {'ROCm' if spec.cluster.accelerator == 'rocm' else 'Ascend'}")
    if isinstance(c, Engine) and c.privileged:
        yield sourced.diagnostic(("container", "privileged"), f"{NOTE}the container gets every device and "
                                 "capability of the host (--privileged); without it, only the accelerators' "
                                 "devices and driver files", at_key=True)
    file = image_file(c) if isinstance(c, (Apptainer, Pyxis)) else None
    if file is not None and file[1] is None and "@sha256:" in c.image:
        yield sourced.diagnostic(("container", "image"), f"an image file is pinned as FILE@sha256:<64 hex digits, "
                                                         f"the sha256sum of FILE>, not {c.image}")
    if isinstance(c, Pyxis) and file is None and "$" not in c.image:
        yield from _enroot_reference(c.image, sourced)
    elif file is None and (problem := digest_problem(getattr(c, "image", None) or "")):
        yield sourced.diagnostic(("container", "image"), problem)
    for i, mount in enumerate(getattr(c, "mounts", ())):
        if ":" not in mount:
            yield sourced.diagnostic(("container", "mounts", i), "a mount is SRC:DST[:OPTIONS]")


# enroot's image reference, [USER@][REGISTRY#]IMAGE[:TAG]: its image is lowercase letters, digits and /._- (enroot's
# docker.sh refuses anything else as an "Invalid image reference"); newer enroots also take REGISTRY/IMAGE@DIGEST
_ENROOT_IMAGE = re.compile(r"[a-z0-9/._-]+")


def digest_problem(image: str) -> str | None:
    """Why the digest an image reference is pinned by (IMAGE@sha256:DIGEST) is one no registry resolves, or None."""
    digest = image.split("@sha256:", 1)[1] if "@sha256:" in image else None
    if digest is None or re.fullmatch(r"[0-9a-f]{64}", digest) or "$" in digest:
        return None
    return (f"{image!r}: a sha256 digest is 64 hex digits (lowercase); {digest!r} has {len(digest)} characters"
            + ("" if re.fullmatch(r"[0-9a-fA-F]*", digest) else ", not all hex digits")
            + ", which no registry resolves")


def _enroot_reference(image: str, sourced: Sourced) -> Iterator[Diagnostic]:
    """What enroot (under pyxis) does with a registry image reference: refuse it, pull something else, or fail at
    the registry after the queue."""
    loc = ("container", "image")
    rest = image.split("@", 1)[0].rsplit("#", 1)[-1]  # IMAGE[:TAG] after the user and the registry
    name, _, tag = rest.partition(":")
    digest = image.split("@sha256:", 1)[1] if "@sha256:" in image else None
    if any(ch.isspace() for ch in image):
        yield sourced.diagnostic(loc, f"{image!r} has white space: enroot refuses it as an invalid image reference")
    elif "::" in image.split("#", 1)[-1]:
        yield sourced.diagnostic(loc, f"{image!r}: '::' is no tag separator; enroot passes ':{tag[1:]}' to the "
                                      f"registry as the tag, which no registry has (IMAGE:TAG, one ':')")
    elif digest is not None and (problem := digest_problem(image)):
        yield sourced.diagnostic(loc, problem)
    elif not _ENROOT_IMAGE.fullmatch(name):
        yield sourced.diagnostic(loc, f"{image!r}: enroot takes an image name of lowercase letters, digits and "
                                      f"/._- only ({name!r}), and refuses it as an invalid image reference")
    elif "#" not in image and re.match(r"[^/]*[.:][^/]*/", name):
        registry, path = name.split("/", 1)
        yield sourced.diagnostic(loc, (
            f"{NOTE}enroot's own syntax names the registry with '#' ({registry}#{path}{':' + tag if tag else ''}); "
            f"an enroot before the Docker form reads {name} as an image of Docker Hub's and fails to pull it. "
            f"Write '#' unless every node's enroot takes REGISTRY/IMAGE"))


def _data(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    options = preprocess.options(spec.verl_version)
    for i, p in enumerate(spec.data.prepare):
        if p.local_dataset_path and options.local_dataset is None and p.script is None:
            yield sourced.diagnostic(("data", "prepare", i, "local_dataset_path"), (
                f"verl {spec.verl_version}'s preprocessing scripts read the dataset from the hub only "
                f"(--local_dataset_path came with verl 0.6.0): remove it, or name a script of your own that takes "
                f"--local_dataset_path"), at_key=True)


def _device(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    """verl's trainer.device follows cluster.accelerator (verlc sets npu where the release has the key)."""
    if not isinstance(chosen, Selection):
        return
    given = next((s for s in settings(spec.verl, chosen.walker) if s.key == "trainer.device"), None)
    npu = spec.cluster.accelerator == "npu"
    if given is not None and (given.value == "npu") != npu:
        yield sourced.diagnostic(given.loc, f"trainer.device {given.value} on cluster.accelerator "
                                            f"{spec.cluster.accelerator}: " + ("remove it (verlc sets npu)" if npu
                                                                                else "remove it"))
    elif npu and not device_defaults(spec, chosen):
        yield sourced.diagnostic(("cluster", "accelerator"), (
            f"{NOTE}verl {chosen.release.version} predates Ascend NPU support (its config has no trainer.device): "
            f"its workers ask Ray for GPUs, which NPU nodes do not have; Ascend runs need verl 0.4 or later"))


def _reproducible(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    if not spec.reproducible:
        return
    image = getattr(spec.container, "image", None)
    if image is None:
        yield sourced.diagnostic(("container",), "reproducible: true needs a container image pinned by digest "
                                                 "(runtime docker, podman, pyxis or apptainer with image@sha256:...)")
    elif isinstance(spec.container, (Apptainer, Pyxis)) and (file := image_file(spec.container)) is not None:
        if file[1] is None:
            yield sourced.diagnostic(("container", "image"), (
                f"reproducible: true needs the image file pinned by its own sha256, which the job checks on every "
                f"node: {image}@sha256:<the sha256sum of {image}>; a file can be replaced"))
    elif "@sha256:" not in image:  # (pinned by a digest that is not 64 hex digits: _container names it)
        yield sourced.diagnostic(("container", "image"), f"reproducible: true needs the image pinned by digest "
                                                         f"({image}@sha256:<64 hex digits>); a tag can move")
    if "verl_version" not in sourced.data and "verl_commit" not in sourced.data:
        yield sourced.diagnostic(("reproducible",), "reproducible: true needs verl_version (or verl_commit) "
                                                    "written in the spec, not taken from verlc's default",
                                 at_key=True)
    if isinstance(spec.model, str) and is_hub_id(spec.model):
        yield sourced.diagnostic(("model",), f"reproducible: true needs the hub model pinned to its commit: "
                                             f"model: {{path: {spec.model}, revision: <40-hex commit sha>}} "
                                             f"(or a local folder: a path starting with / or ./)")
    elif isinstance(spec.model, PinnedModel) and not re.fullmatch(r"[0-9a-f]{40}", spec.model.revision):
        yield sourced.diagnostic(("model", "revision"), f"reproducible: true needs the commit sha (40 hex digits), "
                                                        f"not {spec.model.revision!r}: a branch or tag can move")
    given = {s.key: s for s in settings(spec.verl, chosen.walker)} if isinstance(chosen, Selection) else {}
    for key in determinism.SETTINGS:
        s = given.get(key)
        if s is not None and isinstance(s.value, bool) and s.value is False:
            yield sourced.diagnostic(s.loc, "set to false here, but reproducible: true needs it on")
    if isinstance(chosen, Selection) and not any(k.endswith("full_determinism") for k in determinism.available(chosen)):
        yield sourced.diagnostic(("reproducible",), f"{NOTE}{determinism.describe(chosen)}; it still records and "
                                                    f"compares the run's inputs, image and versions", at_key=True)


def _loggers(spec: Spec, chosen: Selection) -> list[str]:
    """trainer.logger as the run will have it (the spec's, else the release's default)."""
    trainer = spec.verl.get("trainer") if isinstance(spec.verl.get("trainer"), dict) else {}
    logger = trainer.get("logger", chosen.tree.get("trainer", {}).get("logger"))
    if isinstance(logger, str):
        return [logger]
    return [str(x) for x in logger] if isinstance(logger, list) else []  # another value: noted by the type check


def _tracker(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    if not isinstance(chosen, Selection) or "wandb" not in _loggers(spec, chosen):
        return
    if "WANDB_API_KEY" not in spec.secrets and "WANDB_API_KEY" not in spec.env:
        trainer = spec.verl.get("trainer") if isinstance(spec.verl.get("trainer"), dict) else {}
        loc = ("verl", "trainer", "logger") if "logger" in trainer else ("secrets",) if spec.secrets else ("verl",)
        whose = "trainer.logger" if "logger" in trainer else f"{chosen.release.label}'s default trainer.logger"
        yield sourced.diagnostic(loc, (
            f"{NOTE}{whose} has wandb, and WANDB_API_KEY is not in secrets: every node then needs its own W&B "
            f"login (~/.netrc); otherwise add `secrets: [WANDB_API_KEY]` and export it where you submit"),
            at_key=True)


def _stall_timeout(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    """The watchdog counts the steps verl's console logger prints: without it, every run would look hung."""
    if spec.stall_timeout is None or not isinstance(chosen, Selection):
        return
    loggers = _loggers(spec, chosen)
    if "console" not in loggers:
        yield sourced.diagnostic(("stall_timeout",), f"stall_timeout watches the steps verl's console logger "
                                 f"prints, and trainer.logger is {loggers}: add console to it", at_key=True)


def _ray(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    r = spec.ray
    if r.expose_dashboard:
        yield sourced.diagnostic(("ray", "expose_dashboard"), (
            f"{NOTE}Ray's dashboard and Jobs API will answer on every address of the head node, without "
            f"authentication: anyone who reaches it can run code as you (the 'ShadowRay' attacks)"))
    if r.port is not None and r.port == r.dashboard_port:
        yield sourced.diagnostic(("ray", "dashboard_port"), f"same as ray.port ({r.port})")


def _same_value(a: object, b: object) -> bool:
    """Whether verl would see one value: equal numbers (1e-6, 0.000001) but not true and 1."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _sweep(spec: Spec, sourced: Sourced, chosen: Selection, max_variants: int,
           unchecked: tuple[str, ...]) -> Iterator[Diagnostic]:
    """Each variant is checked like a spec of its own; problems point at the sweep value that caused them."""
    assert spec.sweep is not None
    matrix = spec.sweep.matrix
    count = 1
    for values in matrix.values():
        count *= len(values)
    if count > max_variants:
        yield sourced.diagnostic(("sweep", "matrix"), f"{count} variants; more than --max-variants {max_variants}")
        return
    fixed = {d.key for d in derived(spec, chosen.tree)} | {"trainer.experiment_name"}
    given = {s.key for s in settings(spec.verl, chosen.walker)}
    bad = False
    for key in matrix:
        verl_key = key.removeprefix("verl.")
        if verl_key in fixed:
            yield sourced.diagnostic(("sweep", "matrix", key), f"verlc derives {verl_key}; it cannot vary", at_key=True)
            bad = True
        elif verl_key in given:
            yield sourced.diagnostic(("sweep", "matrix", key), f"{key} is also set under verl:; set it in one place",
                                     at_key=True)
            bad = True
        for index, value in enumerate(matrix[key]):
            same = next((i for i, v in enumerate(matrix[key][:index]) if _same_value(v, value)), None)
            if same is not None:  # 1e-6 and 0.000001 are one value to verl: two variants would run one config
                yield sourced.diagnostic(("sweep", "matrix", key, index), (
                    f"{shown(value)} is the value of {key}[{same}] again ({shown(matrix[key][same])}): it would run "
                    f"the same variant twice; remove one"))
                bad = True
    if bad:
        return
    variants = variant_specs(spec)
    yield from _variant_folders(spec, sourced, variants)
    seen: set[tuple[str, str]] = set()
    for matrix_values, variant in variants:
        leaves = settings(variant.verl, chosen.walker)
        unspellable = list(_unspellable(leaves, sourced))
        for d in unspellable or _check_verl(variant, sourced, chosen, unchecked):
            for key, value in matrix_values:
                if d.path == key:
                    index = matrix[key].index(value)
                    d = sourced.diagnostic(("sweep", "matrix", key, index), d.message)
                    d = Diagnostic(d.file, d.line, d.col, f"sweep.matrix.{key}[{index}]", d.message)
                    break
            if (d.path, d.message) not in seen:  # the same problem in many variants is reported once
                seen.add((d.path, d.message))
                yield d


def _variant_folders(spec: Spec, sourced: Sourced, variants: list[tuple[Any, Spec]]) -> Iterator[Diagnostic]:
    """Each variant writes its own checkpoints (and, on reproducible runs, its first-run record there):
    two variants in one folder would resume from each other's checkpoints."""
    folders: dict[str, int] = {}
    for index, (_, variant) in enumerate(variants):
        folder = checkpoint_dir(variant)
        if "experiment_name}" in folder:  # resolves to each variant's own experiment name
            folder += f" ({variant.experiment})"
        if folder in folders:
            loc = ("sweep", "matrix", "verl.trainer.default_local_dir") \
                if "verl.trainer.default_local_dir" in spec.sweep.matrix else ("verl", "trainer", "default_local_dir")
            yield sourced.diagnostic(loc, (
                f"variants {folders[folder]} and {index} would both checkpoint in {folder} (and resume from each "
                f"other's checkpoints): give each variant its own trainer.default_local_dir"), at_key=True)
            return
        folders[folder] = index
    given = own_checkpoint_dir(spec)
    if given is not None and variants and checkpoint_dir(variants[0][1]) != given:
        yield sourced.diagnostic(("verl", "trainer", "default_local_dir"), (
            f"{NOTE}each sweep variant checkpoints in a folder of its own under {given}: "
            f"{checkpoint_dir(variants[0][1])}, ... ({len(variants)} variants)"))


def _container_paths(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    """Docker/podman containers and Pyxis's (unnamed) enroot containers, of the targets that run the spec's
    container, are removed with the job: data, checkpoints and the model cache written inside them, and not under
    a mount, are lost. A note names the path and a mount that keeps it. (Apptainer binds the working folder and
    home itself, and a write outside its binds fails at once instead of being lost: not noted.)"""
    c = spec.container
    if not isinstance(c, (Engine, Pyxis)):
        return

    def as_text(word: str) -> str | None:
        try:
            return parse_word(word).display
        except ValueError:
            return None  # _words reports it; a verl interpolation lands where verl resolves it

    workdir = as_text(c.workdir)
    targets = [t.rstrip("/") for m in c.mounts if m.count(":") >= 1 and (t := as_text(m.split(":")[1])) is not None]
    if workdir is None:
        return

    def inside(path: str) -> str | None:
        text = as_text(path)
        if text is None:
            return None
        return text if text.startswith(("/", "${")) else f"{workdir.rstrip('/')}/{text}"

    places: list[tuple[tuple[str | int, ...], str, str]] = [
        (("data", part, i), f, "data file") for part in ("train_files", "val_files")
        for i, f in enumerate(getattr(spec.data, part))]
    places += [(("data", "prepare", i, "dir"), p.dir, "prepared data") for i, p in enumerate(spec.data.prepare)]
    trainer = spec.verl.get("trainer") if isinstance(spec.verl.get("trainer"), dict) else {}
    given = trainer.get("default_local_dir") if isinstance(trainer, dict) else None
    places.append((("verl", "trainer", "default_local_dir") if given else ("container", "workdir"),
                   checkpoint_dir(spec), "checkpoint folder"))
    if isinstance(spec.model, PinnedModel):
        places.append((("model", "local_dir") if spec.model.local_dir else ("model",), spec.model.folder,
                       "pinned model's folder"))
    if isinstance(spec.model, PinnedModel) or is_hub_id(spec.model):  # downloaded into the HF cache
        # docker/podman run as the image's user (root by default); pyxis as the user who submits
        home = "/root" if isinstance(c, Engine) else "${HOME}"
        cache = spec.env.get("HF_HOME", f"{home}/.cache/huggingface")
        places.append((("env", "HF_HOME") if "HF_HOME" in spec.env else ("model",), cache, "model download cache"))
    for loc, path, what in places:
        full = inside(path)
        if full is not None and not any(full == t or full.startswith(t + "/") for t in targets):
            folder = full.rsplit("/", 1)[0] or "/" if what == "data file" else full
            yield sourced.diagnostic(loc, (
                f"{NOTE}the {what} {full} is inside the container only and is lost when the job's container "
                f"is removed; mount it, e.g. mounts: [\"/host/path:{folder}\"]"))
