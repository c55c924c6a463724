"""What more than one target needs from a spec: the OCI image and working dir of the targets that run an
image on nodes they get (a cluster scheduler, a cloud), env values that must be literal there, and where
checkpoints outlive those nodes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from ..compiler.derive import checkpoint_dir
from ..compiler.diagnostics import Diagnostic
from ..compiler.ir import JobIR, parse_word
from ..compiler.load import Sourced
from ..compiler.spec import Spec
from ..compiler.verl.check import NOTE


@dataclass(frozen=True)
class MountIR:
    """Persistent storage on every node: a claim, a bucket or a volume, mounted at `path`."""

    source: str  # the claim or volume name, or the bucket URL
    path: str  # where it is mounted
    mode: str = ""  # read-only ("ro") for a claim; MOUNT, MOUNT_CACHED or COPY for a bucket


def node_image(spec: Spec, own: str | None) -> str | None:
    """The OCI image a pod or a cloud node runs: the target's own, else the container's (a pyxis
    `registry#image` as registry/image), else the compose section's. None: the spec has none."""
    if own:
        return own
    c = spec.container
    if c.runtime in ("docker", "podman"):
        return c.image  # type: ignore[union-attr]
    if c.runtime == "pyxis":
        return c.image.replace("#", "/", 1)  # type: ignore[union-attr]
    return spec.compose.image if spec.compose else None


def node_workdir(spec: Spec, own: str | None) -> str | None:
    if own:
        return own
    workdir = getattr(spec.container, "workdir", None)
    if spec.container.runtime != "none" and workdir:
        return workdir
    return spec.compose.workdir if spec.compose else None


def path_list(*entries: str) -> str:
    """A PATH-like value of `entries` in order (a variable the target sets and the spec sets too: both kept)."""
    return ":".join(entries)


def persistent_home(path: str, workdir: str | None, mounts: list[str]) -> str | None:
    """The mount (of `mounts`) that holds `path` (relative paths are under `workdir`), or None."""
    full = path if path.startswith("/") else f"{(workdir or '').rstrip('/')}/{path}"
    return next((m for m in mounts if full == m.rstrip("/") or full.startswith(m.rstrip("/") + "/")), None)


def image_problems(spec: Spec, sourced: Sourced, target: str, section: str, image: str | None,
                   workdir: str | None, own_workdir: str | None, system: str) -> Iterator[Diagnostic]:
    """A target that runs an OCI image names it literally (nothing expands it there) and starts the job
    with `cd WORKDIR`, where `system` (its scheduler) expands variables."""
    if image is None or workdir is None:
        yield sourced.diagnostic((section,) if section in sourced.data else ("container", "runtime"), (
            f"the {target} target runs an OCI image: set {section}.image and {section}.workdir (or use "
            f"a docker, podman or pyxis container, or a compose section)"))
    elif "$" in image or "~" in image:
        yield sourced.diagnostic((section, "image"), f"the {target} target names the image literally; "
                                                     f"{image!r} has a variable in it")
    elif not re.fullmatch(r"/[A-Za-z0-9_.@+=,/-]{0,255}", workdir):
        where = (section, "workdir") if own_workdir else ("container", "workdir")
        yield sourced.diagnostic(where, f"the {target} target starts the job with `cd WORKDIR`, where "
                                        f"{system} expands variables: {workdir!r} must be a plain "
                                        f"absolute path (letters, digits and _.@+=,/-)")


def literal_env(spec: Spec, sourced: Sourced, target: str) -> Iterator[Diagnostic]:
    """Targets without a shell on the node set env values as they are."""
    for name, value in spec.env.items():
        try:
            parts = parse_word(value).parts
        except ValueError:
            continue  # the compiler's checks report it
        if any(not isinstance(p, str) for p in parts):
            yield sourced.diagnostic(("env", name), f"the {target} target sets env values as they are; {value!r} "
                                                    f"needs a shell to expand it on the node")


def kept(spec: Spec, sourced: Sourced, workdir: str | None, mounts: list[str], what: str,
         required: str | None) -> Iterator[Diagnostic]:
    """Checkpoints outside `mounts` die with the pods or nodes: an error when `required` says why they must
    live on, else a note."""
    path = checkpoint_dir(spec)
    trainer = spec.verl.get("trainer") if isinstance(spec.verl.get("trainer"), dict) else {}
    loc = ("verl", "trainer", "default_local_dir") if isinstance(trainer, dict) and \
        trainer.get("default_local_dir") else ("name",)
    if "${" not in path and persistent_home(path, workdir, mounts) is not None:
        return
    where = "a path with a variable in it cannot be checked" if "${" in path else f"{path} is not under any of them"
    if required:
        yield sourced.diagnostic(loc, f"{required}: the checkpoints must be on {what} ({where}); set "
                                      f"trainer.default_local_dir under one")
    else:
        yield sourced.diagnostic(loc, f"{NOTE}the checkpoint folder is lost with the nodes unless it is on {what} "
                                      f"({where})")


# A service in an image of its own where it has a network namespace of its own (a compose service, a sidecar of the
# head pod): its port, plus its place among them (Slurm's share the node's: the job's block of ports)
OWN_SERVICE_PORT = 18000


def image_service_tokens(ir: JobIR) -> list[str]:
    """The token variables of the services in images of their own: a target that starts them makes each for
    the run (runtime/protocol.py)."""
    return [dict(s.variables)["token"] for s in ir.services if s.image]


def image_services_refused(spec: Spec, sourced: Sourced, target: str, why: str) -> Iterator[Diagnostic]:
    """Each service in an image of its own, refused at its image where the target cannot start that image's
    container (`why`)."""
    for name, service in spec.services.items():
        if service.image is not None:
            yield sourced.diagnostic(("services", name, "image"), f"the {target} target cannot run services.{name} "
                                                                  f"in an image of its own: {why}", at_key=True)
