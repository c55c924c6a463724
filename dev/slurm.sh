#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine, for the end-to-end tests, the benchmark and developers.
#
#   dev/slurm.sh start    install slurm-wlm + munge if missing (apt, as root), write the config into the
#                         state folder, start munged, slurmctld and one slurmd per node (n1..n8 by default,
#                         $VERLC_SLURM_NODES to change; 8 fake GPUs each)
#   dev/slurm.sh stop     stop exactly the daemons `start` started (by their pid files)
#   dev/slurm.sh env      print `export SLURM_CONF=...`: every Slurm command reads this cluster's config
#   dev/slurm.sh status   sinfo
#
# Nothing outside the state folder (default /tmp/verlc-slurm, or $VERLC_SLURM_STATE) is written or
# read: config, gres.conf, state, spool, logs and pid files live there, and so do munge's own key and
# socket (slurm.conf's AuthInfo points Slurm at that socket). /etc and any system Slurm or munged are
# left alone. The nodes share this host: node nI listens on port 17000+I of 127.0.0.1, the controller
# on 17817. An idle slurmd costs a few MB, so the default 8 nodes are cheap; jobs use what they ask
# for. GPUs are gres entries backed by /dev/tty0..7 (Slurm drops file-less GPUs).
set -euo pipefail

state=${VERLC_SLURM_STATE:-/tmp/verlc-slurm}
conf=$state/slurm.conf
count=${VERLC_SLURM_NODES:-8}
munge_dir=$state/munge
export SLURM_CONF=$conf

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
  mkdir -p "$state/ctld"
  local host cpus mem
  host=$(hostname)
  cpus=$(nproc)
  mem=$(($(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo) / 4))
  cat >"$conf" <<EOF
# Written by verlc's dev/slurm.sh: two nodes on one host, for tests. Use with SLURM_CONF=$conf.
ClusterName=verlc-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=17817
SlurmUser=root
AuthType=auth/munge
# cred_expire: how long a requeued job waits before it may start again (Slurm default 120 s)
AuthInfo=socket=$munge_dir/munge.socket,cred_expire=20
CredType=cred/munge
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
KillWait=30
SlurmctldTimeout=30
SlurmdTimeout=30
EOF
  local i
  for ((i = 1; i <= count; i++)); do
    echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((17000 + i)) CPUs=$cpus RealMemory=$mem Gres=gpu:8 State=UNKNOWN"
  done >>"$conf"
  echo "PartitionName=debug Nodes=n[1-$count] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >>"$conf"
  # Slurm reads gres.conf (and would read cgroup.conf) from slurm.conf's own folder.
  cat >"$state/gres.conf" <<EOF
NodeName=n[1-$count] Name=gpu File=/dev/tty[0-7]
EOF
}

start_munge() {
  # munged's own key and socket: its folder must be owned by munge and searchable by all (0711).
  mkdir -p "$munge_dir"
  if [[ ! -s $munge_dir/munge.key ]]; then
    head -c 1024 /dev/urandom >"$munge_dir/munge.key"
  fi
  chown -R munge:munge "$munge_dir"
  chmod 0711 "$munge_dir"
  chmod 0400 "$munge_dir/munge.key"
  runuser -u munge -- /usr/sbin/munged --socket="$munge_dir/munge.socket" --key-file="$munge_dir/munge.key" \
    --pid-file="$munge_dir/munged.pid" --log-file="$munge_dir/munged.log" --seed-file="$munge_dir/munged.seed" ||
    die "munged did not start; see $munge_dir/munged.log"
}

start() {
  install
  stop_daemons
  write_config
  start_munge
  slurmctld -f "$conf" || die "slurmctld did not start; see $state/slurmctld.log"
  local i deadline=$((SECONDS + 60)) idle
  for ((i = 1; i <= count; i++)); do
    slurmd -f "$conf" -N "n$i" || die "slurmd n$i did not start; see $state/slurmd-n$i.log"
  done
  while ((SECONDS < deadline)); do
    idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
    if ((idle == count)); then
      log "cluster ready: $count nodes idle (export SLURM_CONF=$conf)"
      return
    fi
    sleep 0.5
  done
  die "$idle of $count nodes idle after 60 s; see $state/*.log"
}

stop_daemons() {
  local pidfile pid
  for pidfile in "$state"/slurmd-n*.pid "$state"/slurmctld.pid "$munge_dir"/munged.pid; do
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
  env) printf 'export SLURM_CONF=%q\n' "$conf" ;;
  status) sinfo ;;
  *) die "usage: dev/slurm.sh start|stop|env|status" ;;
esac
