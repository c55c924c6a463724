#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine, for the end-to-end tests, the benchmark and developers.
# Every node is a host of its own: its own network namespace, address, host name and hosts file.
#
#   dev/slurm.sh start               install slurm-wlm + munge if missing (dev/packages.sh), remove what a killed
#                                    run left (naming it), make the nodes' network, write the config into the
#                                    state folder, start munged, slurmctld and one slurmd per node (n1..n8 by
#                                    default, $VERLC_SLURM_NODES to change; 8 fake GPUs each)
#   dev/slurm.sh stop                stop every daemon `start` started (by pid: the pid files, then whatever
#                                    still runs in a node's namespace), remove every namespace and link it made
#   dev/slurm.sh env                 print `export SLURM_CONF=...`: every Slurm command reads this cluster's config
#   dev/slurm.sh status              sinfo
#   dev/slurm.sh link NODE down|up   take a node's network link down (a pulled cable), or back up
#   dev/slurm.sh drop NODE on|off    drop every packet the node sends or receives on its link (iptables in its
#                                    namespace: no link-down, no reset: a black hole), or stop dropping
#   dev/slurm.sh exec NODE CMD...    run CMD on a node (in its namespaces: network, host name, hosts file)
#
# The network: a bridge verlc-br (10.77.0.1/24) in this host's namespace, where slurmctld listens; node nI is
# the network namespace verlc-nI, joined to the bridge by a veth pair (verlc-vI here, eth0 there) with the
# address 10.77.0.(10+I), Slurm's NodeAddr. The namespaces have no default route: nothing they send leaves
# the bridge. Like many real hosts, each node also has a docker0 bridge at 172.17.0.1 (the same address on
# every node, and the first one `hostname -I` prints), and its hosts file maps its own name to 127.0.1.1 as
# Debian writes it (other nodes' names map to their addresses). slurmd runs in the node's namespaces (`ip
# nsenter --net` + `unshare --uts --mount`, the hosts file bind-mounted over /etc/hosts there only), and so does
# every job step Slurm starts on that node.
#
# Nothing outside the state folder (default /tmp/verlc-slurm, or $VERLC_SLURM_STATE) is written or
# read: config, gres.conf, hosts files, state, spool, logs and pid files live there, and so do munge's own
# key and socket (slurm.conf's AuthInfo points Slurm at that socket). /etc and any system Slurm or munged
# are left alone (no /etc/netns). An idle slurmd costs a few MB, so the default 8 nodes are cheap; jobs use
# what they ask for. GPUs are gres entries backed by /dev/tty0..7 (Slurm drops file-less GPUs).
set -euo pipefail

state=${VERLC_SLURM_STATE:-/tmp/verlc-slurm}
conf=$state/slurm.conf
count=${VERLC_SLURM_NODES:-8}
munge_dir=$state/munge
export SLURM_CONF=$conf
readonly bridge=verlc-br subnet=10.77.0 controller_ip=10.77.0.1

log() { printf 'dev/slurm.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if ! [[ $count =~ ^[0-9]+$ ]] || ((count < 1 || count > 200)); then
  die "VERLC_SLURM_NODES=$count: expected 1 to 200"
fi

node_ip() { printf '%s.%d' "$subnet" $((10 + ${1#n})); }
netns() { printf 'verlc-%s' "$1"; }

install() { bash "$(dirname "$0")/packages.sh" slurm; }

# ---- the nodes' network ----------------------------------------------------------------------------------
make_network() {
  ip link add "$bridge" type bridge
  ip addr add "$controller_ip/24" dev "$bridge"
  ip link set "$bridge" up
  local i ns
  for ((i = 1; i <= count; i++)); do
    ns=$(netns "n$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # docker0 first: `hostname -I` then prints its address first, as on a host where Docker runs
    ip -n "$ns" link add docker0 type bridge
    ip -n "$ns" addr add 172.17.0.1/16 dev docker0
    ip -n "$ns" link set docker0 up
    ip link add "verlc-v$i" type veth peer name eth0 netns "$ns"
    ip link set "verlc-v$i" master "$bridge" up
    ip -n "$ns" addr add "$(node_ip "n$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

# remove_network: every namespace and link this script makes (also those a killed run left), after
# stopping by pid whatever still runs in a node's namespace. Prints what it removed.
remove_network() {
  local ns link pids removed=()
  for ns in $(ip netns list | awk '$1 ~ /^verlc-n[0-9]+$/ { print $1 }'); do
    mapfile -t pids < <(ip netns pids "$ns")
    if ((${#pids[@]})); then
      kill -TERM "${pids[@]}" 2>/dev/null || true
      for _ in $(seq 50); do
        mapfile -t pids < <(ip netns pids "$ns")
        ((${#pids[@]})) || break
        sleep 0.1
      done
      ((${#pids[@]} == 0)) || kill -KILL "${pids[@]}" 2>/dev/null || true
      removed+=("$ns: stopped ${#pids[@]} process(es) still running there")
    fi
    ip netns delete "$ns"
    removed+=("$ns")
  done
  for link in $(ip -o link show | awk -F': ' '$2 ~ /^verlc-(v[0-9]+|br)(@|$)/ { sub(/@.*/, "", $2); print $2 }'); do
    ip link delete "$link" 2>/dev/null || true  # a veth may have gone with its peer's namespace
    removed+=("$link")
  done
  ((${#removed[@]} == 0)) || printf '%s\n' "${removed[@]}"
}

write_hosts() {
  local node=$1 i
  {
    echo "# Written by verlc's dev/slurm.sh for $node; bind-mounted over /etc/hosts in its namespace only."
    echo "127.0.0.1 localhost"
    echo "127.0.1.1 $node"
    echo "$controller_ip $(hostname)"
    for ((i = 1; i <= count; i++)); do
      [[ n$i == "$node" ]] || echo "$(node_ip "n$i") n$i"
    done
  } >"$state/hosts-$node"
}

write_config() {
  mkdir -p "$state/ctld"
  local host cpus mem i
  host=$(hostname)
  cpus=$(nproc)
  mem=$(($(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo) / 4))
  cat >"$conf" <<EOF
# Written by verlc's dev/slurm.sh: $count nodes, each in a network namespace of its own. Use with SLURM_CONF=$conf.
ClusterName=verlc-test
SlurmctldHost=$host($controller_ip)
SlurmctldPort=17817
SlurmdPort=6818
SlurmUser=root
AuthType=auth/munge
# cred_expire: how long a requeued job waits before it may start again (Slurm default 120 s)
AuthInfo=socket=$munge_dir/munge.socket,cred_expire=20
# A job that becomes startable by time alone (a requeued one, cred_expire after its requeue) starts at the next
# scheduler pass that no event triggers: backfill's, every 30 s by default
SchedulerParameters=bf_interval=5
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
# The mails a job asks for (--mail-type) go into \$state/mail.log: what slurmctld ran, one line per mail
MailProg=$state/mail
KillWait=30
# After KILL, a step's processes have this long to go before Slurm drains the node ("Kill task failed"; its
# default: 60 s): on this busy 2-core machine a node's Ray processes once took longer, and every later test
# that asked for that node waited for it
UnkillableStepTimeout=300
SlurmctldTimeout=30
# A node that stops answering is DOWN after this long (Slurm's default: 300 s), and its jobs end; longer
# than Ray's node-death detection in the tests (ray.node_timeout 10 s) and the cleanup after it. Slurm pings
# every node every third of it; at 60 s, the network faults test waited two minutes more for Slurm (353 s
# against 239 s, 2026-12-07)
SlurmdTimeout=30
EOF
  for ((i = 1; i <= count; i++)); do
    echo "NodeName=n$i NodeHostname=n$i NodeAddr=$(node_ip "n$i") CPUs=$cpus RealMemory=$mem Gres=gpu:8 Features=h100,ib,rack1 State=UNKNOWN"
    write_hosts "n$i"
  done >>"$conf"
  echo "PartitionName=debug Nodes=n[1-$count] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >>"$conf"
  printf '#!/bin/sh\nprintf "%%s\\n" "$*" >>%q/mail.log\n' "$state" >"$state/mail"
  chmod 755 "$state/mail"
  rm -f "$state/mail.log"
  # Slurm reads gres.conf (and would read cgroup.conf) from slurm.conf's own folder.
  cat >"$state/gres.conf" <<EOF
NodeName=n[1-$count] Name=gpu File=/dev/tty[0-7]
EOF
}

# on_node NODE CMD...: CMD in NODE's namespaces: its network, a host name of its own, its hosts file
on_node() {
  local node=$1
  shift
  if [[ ! -f $state/hosts-$node ]] || ! ip netns list | grep -q "^$(netns "$node")\b"; then
    die "no node $node (is the cluster started?)"
  fi
  # nsenter, not `ip netns exec`: that remounts /sys for the namespace, hiding the cgroup tree slurmd reads
  # shellcheck disable=SC2016  # the inner shell expands its own arguments
  nsenter --net="/run/netns/$(netns "$node")" unshare --uts --mount -- \
    sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' sh "$state/hosts-$node" "$node" "$@"
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
  ((EUID == 0)) || die "the nodes' network namespaces need root"
  local left
  left=$(stop)
  [[ -z $left ]] || log "removed what an earlier run left: ${left//$'\n'/, }"
  # A fresh cluster: no node state (a drain, a DOWN node) or job of an earlier run comes back from the
  # controller's saved state, and no log line of an earlier job with the same id (job ids start over)
  rm -rf "$state/ctld" "$state"/spool-n*
  rm -f "$state"/slurmctld.log "$state"/slurmd-n*.log
  mkdir -p "$state"
  write_config
  make_network
  start_munge
  slurmctld -f "$conf" || die "slurmctld did not start; see $state/slurmctld.log"
  local i deadline=$((SECONDS + 60)) idle
  for ((i = 1; i <= count; i++)); do
    on_node "n$i" slurmd -f "$conf" -N "n$i" || die "slurmd n$i did not start; see $state/slurmd-n$i.log"
  done
  while ((SECONDS < deadline)); do
    idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
    if ((idle == count)); then
      log "cluster ready: $count nodes idle, n1..n$count at $(node_ip n1).. (export SLURM_CONF=$conf)"
      return
    fi
    sleep 0.5
  done
  die "$idle of $count nodes idle after 60 s; see $state/*.log"
}

# stop: the daemons by their pid files, then the network and whatever still runs in it. Prints what it
# found left over in the network (a job's processes, a killed run's namespaces).
stop() {
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
  remove_network
}

# fault WHAT NODE HOW: the network faults the tests inject (link down/up, packets dropped on/off)
fault() {
  local what=$1 node=$2 how=$3 ns
  ns=$(netns "$node")
  if ! [[ $node =~ ^n[0-9]+$ ]] || ! ip netns list | grep -q "^$ns\b"; then
    die "no node '$node' (is the cluster started?)"
  fi
  case $what/$how in
    link/down | link/up) ip link set "verlc-v${node#n}" "$how" ;;
    drop/on)
      ip netns exec "$ns" iptables -I INPUT -i eth0 -j DROP
      ip netns exec "$ns" iptables -I OUTPUT -o eth0 -j DROP ;;
    drop/off)
      ip netns exec "$ns" iptables -D INPUT -i eth0 -j DROP
      ip netns exec "$ns" iptables -D OUTPUT -o eth0 -j DROP ;;
    *) die "usage: dev/slurm.sh link NODE down|up, or drop NODE on|off" ;;
  esac
  log "$node: $what $how"
}

usage="usage: dev/slurm.sh start|stop|env|status, link NODE down|up, drop NODE on|off, exec NODE CMD..."
case ${1:-} in
  start) start ;;
  stop)
    left=$(stop)
    [[ -z $left ]] || log "removed: ${left//$'\n'/, }" ;;
  env) printf 'export SLURM_CONF=%q\n' "$conf" ;;
  status) sinfo ;;
  link | drop) (($# == 3)) || die "$usage"; fault "$@" ;;
  exec) (($# >= 3)) || die "$usage"; node=$2; shift 2; on_node "$node" "$@" ;;
  *) die "$usage" ;;
esac
