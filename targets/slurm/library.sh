# ==== verlc's Slurm library (targets/slurm/library.sh) ==============================================
# The same for every job: what must be bash (srun fan-out, containers, traps, cleanup). It reads only the
# values and commands of the job above it (targets/slurm/view.py decides them), and runs verlc's runtime for
# the rest of the stages. Nothing here is specific to this job.

log() { printf '[%s] verlc: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)" "$*"; }
die() { log "ERROR: $*" >&2; exit 1; }

readonly stop_after=${VERLC_STOP_AFTER:-${stages[-1]}}
[[ " ${stages[*]} " == *" $stop_after "* ]] || die "VERLC_STOP_AFTER=$stop_after: expected one of: ${stages[*]}"

# pause_at POINT: for tests of cancellation, wait here (until signalled) when VERLC_PAUSE_AT names POINT:
# a stage's name (its start), "addresses" (before the nodes are asked) or "ray-wait" (the waiter started).
pause_at() {
  [[ ${VERLC_PAUSE_AT:-} == "$1" ]] || return 0
  log "paused at $1 (VERLC_PAUSE_AT)"
  while :; do sleep 1; done
}

# begin_stage NAME: true when NAME runs; every stage after VERLC_STOP_AFTER is skipped.
stopped=0
begin_stage() {
  pause_at "$1"
  if ((stopped)); then
    log "stage $1: skipped (VERLC_STOP_AFTER=$stop_after)"
    return 1
  fi
  [[ $1 != "$stop_after" ]] || stopped=1
  log "stage $1"
}

# step_for NODE CMD...: sets `step` to the argv that runs CMD on NODE as a job step, inside this
# job's container. Background steps run "${step[@]}" & directly, so that $! is srun itself and
# the cleanup's TERM reaches it (a backgrounded function would be a subshell around it).
exec_prefix=()
container=''
step=()
step_for() {
  local node=$1
  shift
  in_container "$node"
  step=(srun --nodes=1 --ntasks=1 --overlap --nodelist="$node" "${step_args[@]}" "${exec_prefix[@]}" "$@")
}

# fan_out WHERE FUNCTION NODE...: sets `step` to ONE job step that runs FUNCTION on every NODE at once, one
# task per node, on the host (WHERE=host) or where the job's commands run (WHERE=job: inside the
# container for pyxis). However many nodes, each stage of the bring-up is one step, not one per node.
# The tasks get the functions in `node_functions` and the variables in `shared`; when one task fails, Slurm
# ends the step (--kill-on-bad-exit) and the task's own message names its node.
declare -A node_ips=()  # node -> the IPv4 address Ray uses there
declare -A node_devs=()  # node -> the interface of that address
declare -A node_addrs=()  # node -> Slurm's address of it (NodeAddr), where head_interface is not set
controller_ip=''  # the Slurm controller's address, likewise
head_ip='' ray_port='' port_base='' dashboard_port='' client_port=''
readonly shared=(node_ips node_devs node_addrs controller_ip head_ip ray_port port_base dashboard_port client_port image_services
  run_dir runtime_file head_interface image_sha256 step_args ray_logs truncated logs_wait lock_wait ray_kill_after
  agent_first agent_count)
fan_out() {
  local where=$1 fn=$2 nodelist
  shift 2
  nodelist=$(IFS=,; printf '%s' "$*")
  step=(srun --nodes=$# --ntasks=$# --ntasks-per-node=1 --overlap --kill-on-bad-exit=1 --nodelist="$nodelist")
  [[ $where == host ]] || step+=("${step_args[@]}")
  step+=(bash -c "set -uo pipefail; $(declare -p "${shared[@]}"); $(declare -f "${node_functions[@]}"); $fn")
}

# Run by fan_out on each node (SLURMD_NODENAME and SLURM_PROCID are Slurm's, per task) -------------
readonly node_functions=(log in_container image_commands container_commands ray_command node_address fetch_image
  verify_image run_container container_ready await_ray_logs drop_step_lock remove_container remove_leftovers
  startup_timed_out ray_node service_commands run_service)

# node_address: this node's name, the IPv4 address Ray uses on it, and that address's interface (where
# gloo, and NCCL unless told, open their sockets). With network.head_interface: that interface's address.
# Else Slurm's own address of the node (its NodeAddr, resolved here) where that is one of the node's
# addresses, else the one the node reaches the Slurm controller from. Never the host name's address (Debian
# maps it to 127.0.1.1, which no other node reaches) nor the first of several (docker0's 172.17.0.1 is on
# every host).
node_address() {
  local own ip='' candidate
  if [[ -n $head_interface ]]; then
    ip=$(ip -o -4 addr show dev "$head_interface" | awk 'NR == 1 { split($4, a, "/"); print a[1] }')
    [[ -n $ip ]] || { log "ERROR: $SLURMD_NODENAME has no IPv4 address on $head_interface (network.head_interface)"; exit 1; }
    printf '%s %s %s\n' "$SLURMD_NODENAME" "$ip" "$head_interface"
    return
  fi
  own=$(ip -o -4 addr show | awk '$4 !~ /^127[.]/ { split($4, a, "/"); print a[1], $2 }')  # "address interface"
  for candidate in $(getent ahostsv4 "${node_addrs[$SLURMD_NODENAME]:-$SLURMD_NODENAME}" | awk '{ print $1 }'); do
    if grep -q "^$candidate " <<<"$own"; then
      ip=$candidate
      break
    fi
  done
  if [[ -z $ip && -n $controller_ip ]]; then
    ip=$(ip -o -4 route get "$controller_ip" | sed -n 's/.* src \([0-9.]*\).*/\1/p')
    grep -q "^$ip " <<<"$own" || ip=''
  fi
  [[ -n $ip ]] || { log "ERROR: cannot tell which address Ray should use on $SLURMD_NODENAME: Slurm's address for it" \
    "(${node_addrs[$SLURMD_NODENAME]:-none}) is not one of its own (${own//$'\n'/, }); set network.head_interface"; exit 1; }
  printf '%s %s %s\n' "$SLURMD_NODENAME" "$ip" "$(awk -v ip="$ip" '$1 == ip { print $2; exit }' <<<"$own")"
}

# fetch_image: the job's image on this node: built or pulled where the node has not got it, and how long that
# took (a phase of the run's timeline: protocol.IMAGE_LINE)
fetch_image() {
  local image_check=() image_fetch=() image_file='' began=${EPOCHREALTIME//[!0-9]/} took done=pulled
  image_commands
  if "${image_check[@]}" >/dev/null 2>&1; then
    log "image on $SLURMD_NODENAME: present"
    return
  fi
  [[ ${image_fetch[1]} == build ]] && done=built
  log "image on $SLURMD_NODENAME: ${image_fetch[1]}ing"
  "${image_fetch[@]}" || { log "ERROR: image ${image_fetch[1]} failed on $SLURMD_NODENAME"; exit 1; }
  took=$((${EPOCHREALTIME//[!0-9]/} - began))
  log "image on $SLURMD_NODENAME: $done in $((took / 1000000)).$((took % 1000000 / 100000))s"
}

# verify_image: the image file on this node is the one the spec pinned (container.image FILE@sha256:...)
verify_image() {
  local image_check=() image_fetch=() image_file='' sum
  image_commands
  log "checking the sha256 of $image_file on $SLURMD_NODENAME"
  sum=$(sha256sum <"$image_file") || { log "ERROR: cannot read the image $image_file on $SLURMD_NODENAME"; exit 1; }
  [[ ${sum%% *} == "$image_sha256" ]] || { log "ERROR: the image $image_file on $SLURMD_NODENAME has sha256" \
    "${sum%% *}, not the pinned $image_sha256 (container.image): it was replaced"; exit 1; }
}

# run_container: this job's container on this node, for as long as the task runs. Slurm signals every
# process of the step when it ends it (the cleanup, scancel, the time limit): the task then removes the
# container itself, since after scancel no new job step could be started to remove it. The container lives
# only while the task holds the lock on $step_lock (its main process waits for that lock): a signal that
# comes while the engine is still creating it finds nothing to remove, and the engine starts it afterwards
# outside the step, where it ends at once instead of holding the node's GPUs with no job to show for it.
run_container() {
  in_container "$SLURMD_NODENAME"
  local step_lock='' container_run=() container_remove=() container_check=() lock
  container_commands
  if ! { : >"$step_lock" && exec {lock}<"$step_lock" && flock "$lock"; }; then
    log "ERROR: could not lock $step_lock on $SLURMD_NODENAME"; exit 1
  fi
  local run_pid='' rc=0
  trap 'await_ray_logs; remove_container; drop_step_lock "$run_pid" "$step_lock"; exit 143' TERM INT
  remove_container  # one an earlier attempt of this job left (requeued), e.g. created but never started
  log "starting container $container on $SLURMD_NODENAME"
  "${container_run[@]}" {lock}<&- >/dev/null &
  run_pid=$!
  wait "$run_pid" || rc=$?
  rm -f "$step_lock"
  log "container $container on $SLURMD_NODENAME stopped (code $rc)"
  exit $((rc ? rc : 1))
}

# container_ready: wait until this node's container runs commands; then its step lock's file has done its
# part (the container has it mounted) and goes: the lock lives on in the file's inode, which the container
# and run_container's task hold, and nothing is left in /tmp however the step ends later (a scancel's KILL)
container_ready() {
  in_container "$SLURMD_NODENAME"
  local step_lock='' container_run=() container_remove=() container_check=()
  container_commands
  until "${exec_prefix[@]}" true </dev/null 2>/dev/null; do
    sleep 1
  done
  rm -f "$step_lock"
}

# await_ray_logs: where Ray ran in this node's container, give it logs_wait s to stop and keep its logs
# (ray_node), inside Slurm's KillWait (30 s by default) with time left to remove the container
await_ray_logs() {
  local logs=$ray_logs/$SLURMD_NODENAME
  [[ -d $logs ]] || return 0
  for _ in $(seq $((logs_wait * 2))); do
    [[ ! -f $logs/$truncated ]] || return 0
    sleep 0.5
  done
}

# drop_step_lock PID FILE: remove the lock file once PID (the engine's run command) has exited, within
# lock_wait s; while it lives on (still creating the container), the file stays for the container to find
# its lock free
drop_step_lock() {
  for _ in $(seq $((lock_wait * 2))); do
    if [[ -z $1 ]] || ! kill -0 "$1" 2>/dev/null; then rm -f "$2"; return 0; fi
    sleep 0.5
  done
}

# remove_container: remove this job's container on this node, unless it is gone already
remove_container() {
  in_container "$SLURMD_NODENAME"
  local step_lock='' container_run=() container_remove=() container_check=()
  container_commands
  "${container_remove[@]}" >/dev/null 2>&1 || ! "${container_check[@]}" >/dev/null 2>&1 \
    || { log "could not remove container $container on $SLURMD_NODENAME"; exit 1; }
}

# remove_leftovers: what the job's steps may have left on this node once they ended: its container, and the
# step lock's file (which drop_step_lock leaves while the engine's run command outlives its wait)
remove_leftovers() {
  local step_lock='' container_run=() container_remove=() container_check=() service_run=() service_remove=() i
  remove_container
  container_commands
  rm -f "$step_lock"
  for ((i = 0; i < ${#image_services[@]}; i += 6)); do  # the head's, where its step could not remove it
    service_commands "${image_services[i]}"
    "${service_remove[@]}" >/dev/null 2>&1
  done
}

# run_service NAME: the service NAME's own image in the foreground of this step on the head node, its output in
# the run folder (services/NAME.log, which `verlc logs RUN --service NAME` shows); its container removed when the
# step ends however the job ends (the cleanup's TERM, scancel's), and one an earlier attempt left removed first
run_service() {
  local name=$1 service_run=() service_remove=() run_pid='' rc=0
  service_commands "$name"
  trap 'kill -TERM "$run_pid" 2>/dev/null; "${service_remove[@]}" >/dev/null 2>&1; exit 143' TERM INT
  "${service_remove[@]}" >/dev/null 2>&1
  log "starting service $name in its own image on $SLURMD_NODENAME"
  "${service_run[@]}" </dev/null >>"$run_dir/services/$name.log" 2>&1 &
  run_pid=$!
  wait "$run_pid" || rc=$?
  log "service $name's container on $SLURMD_NODENAME stopped (code $rc)"
  exit $((rc ? rc : 1))
}

# Whether `ray start`'s output (a file tee writes) says the raylet did not register in time. tee may not have
# written the lines of a start that failed fast yet: the file is read again for up to 2 s.
startup_timed_out() {
  local _
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    ! grep -qs "timed out during startup" "$1" || return 0
    sleep 0.2
  done
  return 1
}

# ray_node FIRST: this node's Ray until the cleanup stops it: the head where the node's place in the job
# (FIRST + SLURM_PROCID) is 0, a worker elsewhere. A Ray that stops on its own exits non-zero, so that its
# step ends at once (the log names the node); one stopped by a signal (cleanup, scancel) exits 0. However
# Ray stops, the node then keeps Ray's session logs in the run folder (bounded) and removes Ray's temp dir.
# A worker whose raylet did not register with the head within Ray's fixed 30 s ("The current node timed out
# during startup": a busy head or node, `ray start` has no setting for it) is started again, twice at most.
# Ray's temp dir is the attempt's own: a node cut off during the last attempt may still be removing that
# attempt's dir when a requeued attempt starts Ray there in the same place of the job.
ray_node() {
  local i=$(($1 + SLURM_PROCID))
  local node_ip=${node_ips[$SLURMD_NODENAME]} node_dev=${node_devs[$SLURMD_NODENAME]}
  local ray_tmp=/tmp/verlc-ray-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}-$i
  local agent_port=$((port_base + agent_first + i % agent_count))  # in the job's block, however many nodes
  in_container "$SLURMD_NODENAME"
  local ray=()
  ray_command "$i"
  local logs=$ray_logs/$SLURMD_NODENAME  # created now: the container waits for it before going
  mkdir -p "$logs"
  local started=$logs/ray-start.out attempt=1 attempts=3 ray_pid='' rc=0 stop_at=''
  # In a process group of its own: when Slurm signals the step, every Ray process of the node gets TERM,
  # and KILL ray_kill_after s later (a `ray start` signalled mid-startup can hang), well within Slurm's KillWait.
  trap 'stop_at=${stop_at:-$SECONDS}; [[ -z $ray_pid ]] || kill -TERM -- "-$ray_pid" 2>/dev/null' TERM INT
  while :; do
    log "starting Ray on $SLURMD_NODENAME ($node_ip)"
    # Its output also kept in the run folder (a signal to the step leaves that copy running to the end).
    setsid "${exec_prefix[@]}" "${ray[@]}" > >(trap '' TERM INT; exec tee "$started") 2>&1 &
    ray_pid=$! rc=0
    [[ -z $stop_at ]] || kill -TERM -- "-$ray_pid" 2>/dev/null  # the signal came as it started
    wait "$ray_pid" || true
    while kill -0 "$ray_pid" 2>/dev/null; do  # a signal ended `wait`, not Ray: Ray has a few seconds, then KILL
      ((SECONDS - ${stop_at:-$SECONDS} < ray_kill_after)) || kill -KILL -- "-$ray_pid" 2>/dev/null
      sleep 0.5
    done
    wait "$ray_pid" || rc=$?
    if [[ -n $stop_at ]] || ((i == 0 || rc == 0 || attempt == attempts)) || ! startup_timed_out "$started"; then
      break
    fi
    attempt=$((attempt + 1))
    log "Ray on $SLURMD_NODENAME did not register with the head in Ray's 30 s; starting it again ($attempt of $attempts)"
    kill -KILL -- "-$ray_pid" 2>/dev/null
    sleep 2  # Ray's reaper ends what the failed start left (within its 1 s grace), freeing the node's ports
    [[ -z $stop_at ]] || break
  done
  if [[ -n $stop_at ]]; then
    log "Ray on $SLURMD_NODENAME stopped (the job is ending)"
  else
    log "Ray on $SLURMD_NODENAME exited (code $rc)"
  fi
  # In a container, the signal stopped `docker exec`, not Ray: the logs are kept at once (a `ray stop` first
  # took longer than the container waits, under load), and the container's removal then ends Ray there.
  if "${exec_prefix[@]}" python3 - ray-logs --temp-dir "$ray_tmp" --limit-mib 50 <"$run_dir/$runtime_file" \
      | tar -x -C "$logs"; then
    log "kept Ray's logs of $SLURMD_NODENAME"
  else
    log "could not keep Ray's logs of $SLURMD_NODENAME"
  fi
  # Stopped on purpose (the cleanup, scancel): 0, or --kill-on-bad-exit would end the step's other nodes
  # while they keep their logs. Stopped on its own: never 0, so that the step (and bring-up) ends at once.
  [[ -z $stop_at ]] || exit 0
  exit $((rc ? rc : 1))
}

# ---- cleanup: runs on every exit, including scancel (TERM) and Ctrl-C ----------------------------
declare -A ray_steps=()  # srun pid -> which Ray: names what died during bring-up
end_time_pid=''  # keep_end_time's, where the job keeps its end time
cleanup() {
  local rc=$?
  # A second signal (scancel signals every process of the job, and again on a second scancel) must not
  # end the cleanup half-way: note it and go on. (A handler, not an ignore: children get the default.)
  trap - EXIT
  trap 'log "cleanup already running: signal ignored"' INT TERM USR1
  set +e
  log "cleaning up (exit code $rc)"
  # Every step still running gets TERM in its tasks (Slurm's own signal: srun would KILL a step on TERM
  # and only report on one INT), so the trainer stops and each node's Ray stops and keeps its logs.
  # KILL whatever is left before Slurm's KillWait runs out (after scancel or the time limit, Slurm kills
  # this script then), at most after cleanup_cap s.
  local pids pid alive patience
  if [[ -n $end_time_pid ]]; then  # keep_end_time (its trap ends the sleep it waits in)
    kill -TERM "$end_time_pid" 2>/dev/null
  fi
  patience=$(scontrol show config 2>/dev/null | awk '$1 == "KillWait" { print $3 }')
  [[ $patience =~ ^[0-9]+$ ]] && ((patience > 4)) && patience=$((patience - cleanup_margin)) || patience=2
  ((patience <= cleanup_cap)) || patience=$cleanup_cap
  mapfile -t pids < <(jobs -p)
  if ((${#pids[@]})); then
    scancel --signal=TERM "$this_job" 2>/dev/null || kill -TERM "${pids[@]}" 2>/dev/null
    for _ in $(seq "$patience"); do
      alive=0
      for pid in "${pids[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then alive=1; fi
      done
      ((alive)) || break
      sleep 1
    done
    kill -KILL "${pids[@]}" 2>/dev/null
  fi
  wait
  # Each container's own step removed it on TERM, once its Ray had kept its logs; remove what is left
  # (this needs a new job step, which Slurm refuses after scancel: there the containers' steps did it).
  if ((long_lived_containers && ${#nodes[@]})); then
    fan_out host remove_leftovers "${nodes[@]}"
    timeout 120 "${step[@]}" \
      || log "no step could look for leftover containers (after scancel, each container's own step removed it)"
  fi
  if ((requeue_enabled && requeue && ${SLURM_RESTART_COUNT:-0} >= max_requeues)); then
    log "not requeued: max_requeues ($max_requeues) reached: this job was requeued ${SLURM_RESTART_COUNT:-0}" \
      "time(s) already (cluster.slurm.max_requeues)"
  elif ((requeue_enabled && requeue)); then
    log "requeueing job $this_job"
    scontrol requeue "$this_job" || log "scontrol requeue failed"
  fi
  log "exit code $rc"
  exit "$rc"
}
nodes=()
requeue=0  # set by the USR1 trap below, and where a node was lost

# seconds_left: the seconds until this job's time limit, as Slurm has it now (`scontrol update` may have moved
# it); a large number where it has none
seconds_left() {
  local left
  left=$(squeue --noheader --jobs="$SLURM_JOB_ID" --format=%L 2>/dev/null | head -n 1)
  if [[ $left =~ ^([0-9]+)-([0-9]+):([0-9]+):([0-9]+)$ ]]; then
    echo $(((10#${BASH_REMATCH[1]} * 24 + 10#${BASH_REMATCH[2]}) * 3600 + 10#${BASH_REMATCH[3]} * 60 + 10#${BASH_REMATCH[4]}))
  elif [[ $left =~ ^([0-9]+):([0-9]+):([0-9]+)$ ]]; then
    echo $((10#${BASH_REMATCH[1]} * 3600 + 10#${BASH_REMATCH[2]} * 60 + 10#${BASH_REMATCH[3]}))
  elif [[ $left =~ ^([0-9]+):([0-9]+)$ ]]; then
    echo $((10#${BASH_REMATCH[1]} * 60 + 10#${BASH_REMATCH[2]}))
  else
    echo 999999999
  fi
}

# on_usr1: Slurm's USR1 (--signal) comes requeue_grace before the time limit, or ahead of a preemption: stop
# cleanly and requeue. At the time limit, the run folder says so to the next attempt, whose runtime refuses to
# train again where this attempt saved no new checkpoint (it would repeat the same steps, requeue after requeue).
on_usr1() {
  log "USR1: preemption or time limit ahead; stopping and requeueing"
  requeue=1
  if (($(seconds_left) <= requeue_grace + 60)); then
    printf '%s\n' "${SLURM_RESTART_COUNT:-0}" >"$time_limit_reached"
  fi
  exit 143
}

# await_node_failure: a node of the job was lost. Slurm ends a job on a node's failure and requeues it itself
# once it has seen the node stop answering (SlurmdTimeout); the next attempt then does not get that node. Wait
# for that; where the node still answers Slurm (only its Ray was lost), requeue this job ourselves.
await_node_failure() {
  local patience gone
  patience=$(scontrol show config 2>/dev/null | awk '$1 == "SlurmdTimeout" { print $3 }')
  [[ $patience =~ ^[0-9]+$ ]] || patience=300
  log "a node was lost: waiting up to $((patience + 30))s for Slurm to see it fail and requeue this job"
  for _ in $(seq $((patience + 30))); do
    gone=$(sinfo --noheader --Node --nodes="$SLURM_JOB_NODELIST" --states=down --format=%N 2>/dev/null)
    if [[ -n $gone ]]; then
      log "Slurm sees ${gone//$'\n'/, } down: it requeues this job"
      return
    fi
    sleep 1
  done
  log "every node still answers Slurm: requeueing this job"
  requeue=1
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
# Where the job may requeue, Slurm sends USR1 before preemption or the time limit (--signal): stop cleanly,
# then requeue; the restarted job resumes from the run's checkpoints (trainer.resume_mode=auto).
if ((requeue_enabled)); then
  trap on_usr1 USR1
fi

# keep_end_time: the job's end (epoch seconds) in end_file, as Slurm has it now (`scontrol update` moves it):
# verlc's runtime reads it when the trainer starts, and verl saves a checkpoint ahead of it
keep_end_time() {
  local end
  trap 'kill "$!" 2>/dev/null; exit 0' TERM  # the cleanup's: ends the sleep it waits in, quietly
  while :; do
    end=$(squeue --noheader --jobs="$SLURM_JOB_ID" --format=%e 2>/dev/null | head -n 1)
    if [[ $end =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}T ]] && end=$(date -d "$end" +%s 2>/dev/null); then
      printf '%s\n' "$end" >"$end_file.tmp" && mv -f "$end_file.tmp" "$end_file"
    fi
    sleep 30 &
    wait "$!"
  done
}

# allocation: one Ray node per Slurm node (verl #548: one array element per host), as the spec asks
check_allocation() {
  mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:?not inside a Slurm job}")
  ((${#nodes[@]} == expected_nodes)) \
    || die "allocation has ${#nodes[@]} nodes (${SLURM_JOB_NODELIST}), the spec asks for $expected_nodes"
  ((${SLURM_JOB_NUM_NODES:-0} == expected_nodes)) \
    || die "SLURM_JOB_NUM_NODES=${SLURM_JOB_NUM_NODES:-unset}, the spec asks for $expected_nodes"
  if [[ -n ${SLURM_GPUS_ON_NODE:-} ]] && ((SLURM_GPUS_ON_NODE != gpus_per_node)); then
    die "Slurm gives $SLURM_GPUS_ON_NODE GPUs per node, the spec asks for $gpus_per_node"
  fi
  head_node=${nodes[0]}
  log "job $this_job on ${nodes[*]}; head $head_node; SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}"
  if ((requeue_enabled && ${SLURM_RESTART_COUNT:-0} > max_requeues)); then  # Slurm requeues a job on a node's failure
    requeue=0
    die "this job was requeued ${SLURM_RESTART_COUNT} times, more than cluster.slurm.max_requeues ($max_requeues)"
  fi
}

# Ray addresses: per-job ports so two jobs sharing a node do not collide. Each job owns a block of ports
# (targets/slurm/ports.py): between Ray's worker ports (10002-19999) and Linux's ephemeral range
# (32768-60999), by job id; ray.port and ray.dashboard_port pin the ports instead. In the block: Ray's GCS,
# dashboard and client server, the nodes' dashboard agents, HCCL's on Ascend.
plan_ports() {
  port_base=$((port_first + SLURM_JOB_ID % port_blocks * port_size))
  ray_port=${pinned_ray_port:-$((port_base + port_gcs))}
  dashboard_port=${pinned_dashboard_port:-$((port_base + port_dashboard))}
  client_port=$((port_base + port_client))
  local i
  for ((i = 0; i < ${#hccl_ports[@]}; i += 3)); do
    export "${hccl_ports[i]}=$((port_base + hccl_ports[i + 1]))-$((port_base + hccl_ports[i + 2]))"
  done
}

# One job step asks every node for its address.
find_addresses() {
  local node addr ctl ip dev addresses
  if [[ -z $head_interface ]]; then
    while read -r node addr; do
      node_addrs[$node]=$addr
    done < <(sinfo --noheader --Node --nodes="$SLURM_JOB_NODELIST" --format='%N %o')
    ctl=$(scontrol show config | awk '$1 ~ /^SlurmctldHost/ { print $3; exit }')  # host or host(address)
    ctl=${ctl%)}
    controller_ip=$(getent ahostsv4 "${ctl#*(}" | awk 'NR == 1 { print $1 }')
  fi
  fan_out host node_address "${nodes[@]}"
  addresses=$("${step[@]}") || die "could not ask every node for its address (the node is named above)"
  while read -r node ip dev; do
    node_ips[$node]=$ip
    node_devs[$node]=$dev
  done <<<"$addresses"
  for node in "${nodes[@]}"; do
    [[ -n ${node_ips[$node]:-} ]] || die "no IPv4 address found for $node"
  done
  head_ip=${node_ips[$head_node]}
  if ((expected_nodes > 1)) && [[ $head_ip == 127.* ]]; then
    die "Ray's head address on $head_node is $head_ip, a loopback address the other nodes cannot reach (network.head_interface)"
  fi
  if ((expose_dashboard)); then
    log "Ray head $head_ip:$ray_port, dashboard and Jobs API http://$head_ip:$dashboard_port (open: ray.expose_dashboard)"
  else
    log "Ray head $head_ip:$ray_port, dashboard http://127.0.0.1:$dashboard_port on $head_node only"
  fi
}

# The first stage: check the pinned image, build or pull it, start the long-lived containers, on every node at once.
start_containers() {
  local containers_step ready_step
  if [[ -n $image_sha256 ]]; then
    fan_out host verify_image "${nodes[@]}"
    "${step[@]}" || die "the image is not the pinned one on every node (the node is named above)"
  fi
  if ((!long_lived_containers)); then
    log "no long-lived containers for this runtime"
    return
  fi
  if ((fetches_image)); then
    fan_out host fetch_image "${nodes[@]}"
    "${step[@]}" || die "the image could not be had on every node (the node is named above)"
  fi
  fan_out host run_container "${nodes[@]}"
  "${step[@]}" &
  containers_step=$!
  fan_out host container_ready "${nodes[@]}"
  "${step[@]}" &
  ready_step=$!
  while kill -0 "$ready_step" 2>/dev/null; do
    kill -0 "$containers_step" 2>/dev/null || die "the containers did not start on every node (the node is named above)"
    sleep 1
  done
  wait "$ready_step" || die "the containers did not start on every node (the node is named above)"
}

# start_image_services: each service in an image of its own, in a step of its own on the head node beside Ray's
# bring-up (run_service), its variables exported first for that step and for the runtime's (runtime/protocol.py):
# the head's address, its port of the services' block, a token made for this run alone
start_image_services() {
  local i first port token
  ((${#image_services[@]})) || return 0
  first=${!services_block%%-*}
  mkdir -p "$run_dir/services"
  for ((i = 0; i < ${#image_services[@]}; i += 6)); do
    port=$((first + image_services[i + 1]))
    token=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
    export "${image_services[i + 2]}=$head_ip" "${image_services[i + 3]}=$port"
    export "${image_services[i + 4]}=http://$head_ip:$port" "${image_services[i + 5]}=$token"
    fan_out host "run_service ${image_services[i]}" "$head_node"
    "${step[@]}" &
  done
}

# The second stage, and verlc's runtime for the rest: one step for the head's Ray, one for every worker's (each
# node's own values in ray_node above), then the runtime in one step on the head node (the same stages every
# bundle runs: wait for every node and GPU, data, preflight, train). What it reads from its environment is
# given on its command line (`docker exec` passes no environment).
run_job() {
  local name rc=0 job_step pid
  start_image_services
  log "starting Ray head on $head_node"
  fan_out job "ray_node 0" "$head_node"
  "${step[@]}" &
  ray_steps[$!]="Ray on $head_node"
  if ((${#nodes[@]} > 1)); then
    fan_out job "ray_node 1" "${nodes[@]:1}"
    "${step[@]}" &
    ray_steps[$!]="Ray on a worker (named above)"
  fi
  local runtime_env=(
    "RAY_ADDRESS=$head_ip:$ray_port" "SLURM_SUBMIT_DIR=$SLURM_SUBMIT_DIR" "SLURM_JOB_ID=$SLURM_JOB_ID"
    "VERLC_STOP_AFTER=$stop_after" "VERLC_PAUSE_AT=${VERLC_PAUSE_AT:-}" "VERLC_ACCEPT_CHANGES=${VERLC_ACCEPT_CHANGES:-}"
    "VERLC_NODE_NAMES=${nodes[*]}" "SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}"
  )
  for name in "${interface_variables[@]}"; do  # as Ray's own processes there: the interface of its address
    runtime_env+=("$name=${node_devs[$head_node]}")
  done
  local runtime_args=(job --begun "${stages[1]}" --json "$(job_description)")
  ((!sweep)) || runtime_args+=(--variant-json "$(variant_description)")
  log "the job's log:" "$job_log"
  step_for "$head_node" env "${runtime_env[@]}" python3 - "${runtime_args[@]}"
  # In the background so that TERM/INT reach the traps at once instead of after training.
  "${step[@]}" <"$run_dir/$runtime_file" > >(tee -a "$job_log") 2>&1 &
  job_step=$!
  pause_at ray-wait
  # Fail fast when a node's Ray stops while the job runs.
  while kill -0 "$job_step" 2>/dev/null; do
    for pid in "${!ray_steps[@]}"; do
      kill -0 "$pid" 2>/dev/null || die "${ray_steps[$pid]} exited during bring-up or training; its output is above"
    done
    sleep 1
  done
  wait "$job_step" || rc=$?
  if ((rc == 0)); then
    log "the job's stages finished"
    return
  fi
  log "the job's stages exited with code $rc"
  if ((requeue_enabled && rc == node_lost)); then  # Ray declared a node dead (the protocol's NODE_LOST)
    await_node_failure
  fi
  exit "$rc"
}

main() {
  check_allocation
  mkdir -p "$run_dir"
  runtime_source >"$run_dir/$runtime_file"  # verlc's runtime, below the banner at the end of this script
  if [[ -n $end_file ]]; then
    # not one of this shell's jobs (disowned): the cleanup stops it by its pid, and bash reports no "Killed"
    keep_end_time &
    end_time_pid=$!
    disown "$end_time_pid"
  fi
  # For `verlc attach`: where the job's commands run on the head node, NUL-separated: the node, the
  # number of srun arguments, those arguments, then the command prefix (the container's exec, if any).
  in_container "$head_node"
  printf '%s\0' "$head_node" "${#step_args[@]}" "${step_args[@]}" "${exec_prefix[@]}" >"$attach_file"
  job_environment  # exported before any container or Ray process starts (verl #158)
  plan_ports
  pause_at addresses
  find_addresses
  if begin_stage "${stages[0]}"; then
    start_containers
  fi
  if begin_stage "${stages[1]}"; then
    run_job
  else
    for stage in "${stages[@]:2}"; do
      log "stage $stage: skipped (VERLC_STOP_AFTER=$stop_after)"
    done
  fi
}
