#!/usr/bin/env bash
# The Debian packages the test suite's tools come from, installed once where missing (apt, as root).
#
#   dev/packages.sh [GROUP...]   install what the groups need and the machine lacks (default: every group)
#
#   slurm       slurm-wlm, munge              the local Slurm test cluster (dev/slurm.sh)
#   containers  podman, runc, debootstrap     podman, its Docker API and the test image (dev/containers.sh)
#   editor      npm                           yaml-language-server for tests/test_editor.py (dev/test.sh)
#
# dev/test.sh calls it once, before its pytest processes start; dev/slurm.sh and dev/containers.sh call it
# for their own group when run alone. Calls made at once wait for each other (a lock file in /tmp): apt
# takes the dpkg lock for one installer at a time, and a second apt-get fails on it instead of waiting.
set -euo pipefail

log() { printf 'dev/packages.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# group -> "command:package ..." (a package is wanted when its command is missing)
declare -A groups=(
  [slurm]="slurmctld:slurm-wlm slurmd:slurm-wlm munged:munge"
  [containers]="podman:podman runc:runc debootstrap:debootstrap"
  [editor]="npm:npm"
)

(($#)) || set -- slurm containers editor
exec 9>/tmp/verlc-packages.lock
flock 9
wanted=()
for group in "$@"; do
  [[ -n ${groups[$group]:-} ]] || die "unknown group '$group' (slurm, containers, editor)"
  for pair in ${groups[$group]}; do
    command -v "${pair%%:*}" >/dev/null || wanted+=("${pair#*:}")
  done
done
((${#wanted[@]})) || exit 0
mapfile -t wanted < <(printf '%s\n' "${wanted[@]}" | sort -u)
((EUID == 0)) || die "${wanted[*]} missing, and installing them needs root"
log "installing ${wanted[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${wanted[@]}" >/dev/null
