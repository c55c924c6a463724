#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for the end-to-end tests and for developers.
#
#   dev/slurm.sh start    install slurm-wlm + munge if missing (apt, as root), write the config,
#                         start munged, slurmctld and two slurmd (n1, n2; 8 fake GPUs each), wait for idle
#   dev/slurm.sh stop     stop the daemons started by `start`
#   dev/slurm.sh status   sinfo
#
# The nodes share this host: n1 and n2 listen on ports 17001 and 17002 of 127.0.0.1. GPUs are gres
# entries backed by /dev/tty0..7 (Slurm drops file-less GPUs); nothing here needs a real GPU.
set -euo pipefail

state=${VERLC_SLURM_STATE:-/var/tmp/verlc-slurm}
conf=/etc/slurm/slurm.conf

log() { printf 'dev/slurm.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

install() {
  if command -v slurmctld >/dev/null && command -v munged >/dev/null; then
    return
  fi
  ((EUID == 0)) || die "slurm-wlm and munge are missing and installing them needs root"
  log "installing slurm-wlm and munge"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_config() {
  mkdir -p "$state" /etc/slurm
  local host cpus mem
  host=$(hostname)
  cpus=$(nproc)
  mem=$(($(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo) / 4))
  cat >"$conf" <<EOF
# Written by verlc's dev/slurm.sh: two nodes on one host, for tests.
ClusterName=verlc-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$state/ctld
SlurmctldPidFile=$state/slurmctld.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdSpoolDir=$state/spool-%n
SlurmdPidFile=$state/slurmd-%n.pid
SlurmdLogFile=$state/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=10
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=17001 CPUs=$cpus RealMemory=$mem Gres=gpu:8 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=17002 CPUs=$cpus RealMemory=$mem Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  cat >/etc/slurm/gres.conf <<'EOF'
NodeName=n[1-2] Name=gpu File=/dev/tty[0-7]
EOF
  rm -f /etc/slurm/cgroup.conf  # proctrack/linuxproc and task/none: no cgroups needed
  mkdir -p "$state/ctld"
}

start() {
  install
  stop_daemons
  write_config
  mkdir -p /run/munge
  chown munge:munge /run/munge
  if ! pgrep -x munged >/dev/null; then
    runuser -u munge -- /usr/sbin/munged
  fi
  slurmctld -f "$conf" || die "slurmctld did not start; see $state/slurmctld.log"
  slurmd -f "$conf" -N n1 || die "slurmd n1 did not start; see $state/slurmd-n1.log"
  slurmd -f "$conf" -N n2 || die "slurmd n2 did not start; see $state/slurmd-n2.log"
  local deadline=$((SECONDS + 60)) states
  while ((SECONDS < deadline)); do
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | tr '\n' ' ')
    if [[ $states == "n1 idle n2 idle " ]]; then
      log "cluster ready: $states"
      return
    fi
    sleep 0.5
  done
  die "nodes not idle after 60 s (sinfo: ${states:-nothing}); see $state/*.log"
}

stop_daemons() {
  local pidfile pid
  for pidfile in "$state"/slurmd-n1.pid "$state"/slurmd-n2.pid "$state"/slurmctld.pid; do
    [[ -f $pidfile ]] || continue
    pid=$(<"$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    rm -f "$pidfile"
  done
}

case ${1:-} in
  start) start ;;
  stop) stop_daemons ;;
  status) sinfo ;;
  *) die "usage: dev/slurm.sh start|stop|status" ;;
esac
