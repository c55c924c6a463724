#!/usr/bin/env bash
# A real container runtime on this machine for the tests: podman, a `docker` command that runs it, a test
# image built without any registry, and podman's Docker API for the Docker Compose binary.
#
#   dev/containers.sh image   install podman, runc and debootstrap if missing (dev/packages.sh), then build the
#                             test image unless the state folder has it for this recipe (prints its name)
#   dev/containers.sh start   start `podman system service` on STATE/podman.sock (the Docker API)
#   dev/containers.sh stop    stop exactly the service `start` started (by its pid file)
#   dev/containers.sh release unmount the overlay store's folder podman keeps mounted, when no container runs
#   dev/containers.sh env     print the exports that point podman, docker and Compose at this state folder
#
# Nothing outside the state folder (default /tmp/verlc-containers, or $VERLC_CONTAINER_STATE) is written:
# podman reads its config from CONTAINERS_CONF / CONTAINERS_STORAGE_CONF there (overlay storage where the kernel
# mounts it there, else vfs; runc, cgroupfs, no default ulimits: this sandbox lacks CAP_SYS_RESOURCE), and
# /etc/containers is left alone.
# `docker` is dev/bin/docker on the tests' own PATH (the podman-docker package would replace a real Docker).
# No GPU here: podman 4.3 takes `--gpus all` and ignores it, and reads CDI specs (`--device
# nvidia.com/gpu=all`) only from /etc/cdi and /var/run/cdi, which the tests leave alone.
#
# The image: Debian bookworm (debootstrap minbase from apt's mirror), a venv at /opt/venv with Ray and its
# dashboard, verl --no-deps, pyarrow (the in-cluster helper reads parquet), in the versions of
# dev/constraints.txt. Its tag is the recipe's digest (this file and the constraints), so a changed recipe
# builds a new image and an unchanged one is reused.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
state=${VERLC_CONTAINER_STATE:-/tmp/verlc-containers}
suite=bookworm

log() { printf 'dev/containers.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

recipe=$(cat "$here/containers.sh" "$here/constraints.txt" | sha256sum | cut -c1-12)
image=localhost/verlc-test:$recipe

# overlay where the kernel mounts one on the state folder (as root, on ext4: this machine), else vfs (e.g. in a
# container whose /tmp is an overlay itself). vfs copies the whole image for every container: 8.5 to 14 s each
# here for the 853 MB test image, against 0.35 s for `podman run --rm IMAGE true` on overlay. Each driver has a
# store of its own: podman refuses a store that another driver wrote.
storage_driver() {
  local probe=$state/overlay-probe
  rm -rf "$probe"
  mkdir -p "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
  if mount -t overlay overlay -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" \
      2>/dev/null; then
    umount "$probe/merged"
    echo overlay
  else
    echo vfs
  fi
  rm -rf "$probe"
}

write_config() {
  mkdir -p "$state"
  local driver
  driver=$(storage_driver)
  if [[ -d $state/storage ]]; then  # the store of this script's earlier layout (vfs only): no mounts, plain files
    log "removing the earlier vfs store $state/storage"
    rm -rf "${state:?}/storage" "${state:?}/run"
  fi
  cat >"$state/containers.conf" <<EOF
# Written by verlc's dev/containers.sh; used through CONTAINERS_CONF.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  cat >"$state/storage.conf" <<EOF
# Written by verlc's dev/containers.sh; used through CONTAINERS_STORAGE_CONF.
[storage]
driver = "$driver"
graphroot = "$state/storage-$driver"
runroot = "$state/run-$driver"
EOF
}

export_env() {
  export CONTAINERS_CONF=$state/containers.conf CONTAINERS_STORAGE_CONF=$state/storage.conf
}

install() { bash "$here/packages.sh" containers; }

mirror() {
  local uri
  uri=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [[ -n $uri ]] || uri=$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
  printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

build_image() {
  if podman image exists "$image"; then
    printf '%s\n' "$image"
    return
  fi
  local started=$SECONDS rootfs=$state/rootfs-$recipe
  rm -rf "$rootfs"
  log "building $image: debootstrap $suite"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,iproute2,procps \
    "$suite" "$rootfs" "$(mirror)" >"$state/debootstrap.log" 2>&1 || die "debootstrap failed; see $state/debootstrap.log"
  # This machine's DNS, pip config and CA bundle (a proxy may sign PyPI's certificates), for the build.
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  [[ ! -f /etc/pip.conf ]] || cp /etc/pip.conf "$rootfs/etc/pip.conf"
  cp "$here/constraints.txt" "$rootfs/tmp/constraints.txt"
  log "building $image: Python packages"
  # verl without its dependencies (the jobs' trainer is a stand-in), and what verl 0.9.1's trainer imports as it
  # starts from its verl-core extra (TransferQueue, with what it imports beside the torch the tests mount): the
  # preflight of a verl 0.9.1 job checks that it imports on every node
  chroot "$rootfs" /bin/sh -c 'python3 -m venv /opt/venv && /opt/venv/bin/pip install --quiet --no-cache-dir \
      --disable-pip-version-check -c /tmp/constraints.txt "ray[default]" pyarrow \
    && /opt/venv/bin/pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps -c /tmp/constraints.txt verl \
      TransferQueue tensordict pyzmq msgspec omegaconf antlr4-python3-runtime pyvers orjson importlib_metadata zipp \
      numpy cloudpickle dill psutil tqdm sympy mpmath' \
    >"$state/pip.log" 2>&1 || die "pip install in the image failed; see $state/pip.log"
  rm -f "$rootfs/tmp/constraints.txt" "$rootfs/etc/resolv.conf"
  log "building $image: import"
  tar -C "$rootfs" -c . | podman import --quiet --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'WORKDIR /' - "$image" >/dev/null || die "podman import failed"
  local seconds=$((SECONDS - started)) bytes
  bytes=$(du -sb "$rootfs" | cut -f1)
  rm -rf "$rootfs"
  printf '{"image": "%s", "build_seconds": %d, "rootfs_bytes": %d}\n' "$image" "$seconds" "$bytes" >"$state/image-$recipe.json"
  # Older test images are of no further use.
  podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/verlc-test:' | grep -v ":$recipe\$" \
    | xargs -r podman rmi -f >/dev/null 2>&1 || true
  log "built $image in ${seconds}s ($((bytes / 1048576)) MiB)"
  printf '%s\n' "$image"
}

start_service() {
  stop_service
  # 9>&-: the service outlives this script and must not hold its lock
  podman system service --time=0 "unix://$state/podman.sock" >"$state/service.log" 2>&1 9>&- &
  echo $! >"$state/service.pid"
  local deadline=$((SECONDS + 30))
  until [[ -S $state/podman.sock ]]; do
    ((SECONDS < deadline)) || die "podman's service did not start; see $state/service.log"
    sleep 0.2
  done
}

stop_service() {
  [[ -f $state/service.pid ]] || return 0
  local pid
  pid=$(<"$state/service.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  rm -f "$state/service.pid" "$state/podman.sock"
}

# release: podman's overlay driver keeps its home folder bind-mounted once it has run; unmounted here when no
# container runs, so that the tests leave no mount behind (podman mounts it again when next run)
release() {
  local home=$state/storage-overlay/overlay
  [[ -z $(podman ps --quiet 2>/dev/null) ]] || return 0
  if mountpoint -q "$home"; then umount "$home"; fi
}

mkdir -p "$state"
# One at a time: two pytest processes (a developer's, beside dev/test.sh) may build the image or write the
# configuration at once.
exec 9>"$state/.lock"
flock 9
case ${1:-} in
  image) install; write_config; export_env; build_image ;;
  start) write_config; export_env; start_service ;;
  stop) stop_service ;;
  release) export_env; release ;;
  env)
    printf 'export CONTAINERS_CONF=%q CONTAINERS_STORAGE_CONF=%q\n' "$state/containers.conf" "$state/storage.conf"
    printf 'export DOCKER_HOST=%q PATH=%q\n' "unix://$state/podman.sock" "$here/bin:$PATH"
    printf 'export VERLC_TEST_IMAGE=%q\n' "$image"
    ;;
  *) die "usage: dev/containers.sh image|start|stop|release|env" ;;
esac
