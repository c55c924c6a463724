#!/usr/bin/env bash
# The GPU rehearsal: on a machine with an NVIDIA GPU and no network, install what the run needs from the wheels
# dev/gpu/wheels.sh fetched (.whl/), make the tiny model and data offline, start a one-node Ray head, and submit
# verlc's bundles with `verlc submit` (which runs each bundle's own submit.sh): the training specs
# (specs/gpu-rehearsal-reinforce.yaml; specs/gpu-rehearsal-judge.yaml, the same with an LLM judge served beside the
# trainer on its GPU; specs/gpu-rehearsal-sft.yaml, SFT under torchrun;
# specs/pipelines/gpu-rehearsal-pipeline.yaml, two stages, the second from the first's merged model;
# specs/gpu-rehearsal-sft-two-nodes.yaml, torchrun on two Ray nodes, where the machine has two GPUs) must train; the
# configs of dev/gpu/cases/ must fail before the trainer, at the build or in the preflight. Writes into OUT
# (default /tmp/gpu-rehearsal-out): its log, everything it saw
# (rehearsal.tar.gz: logs, events, versions, results), and docs/gpu.md's text and figure (dev/gpu/report.py):
# copy gpu.md, gpu-rehearsal.svg and gpu-timeline.svg into docs/.
#
#   bash dev/gpu/rehearse.sh                    # from the repository root, .whl/ beside it: every part
#   bash dev/gpu/rehearse.sh train judge cases  # some parts (of train judge cases sft pipeline sft-two; and
#                                               # vllm vllm-resume vllm-fit[-SHAPE] vllm-oom[-direct]
#                                               # vllm-judge
#                                               # vllm-cases: verl 0.9.1)
#
# A device call lasts at most 10 minutes: run the parts in two calls, unpack both calls' rehearsal.tar.gz into one
# folder (their events.tsv appended) and run dev/gpu/report.py on it here.
#
# Run by hand (through the device tool here) when the runtime, the preflight or the trainer command changes.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
parts=" ${*:-train judge cases sft pipeline sft-two} "
want() { [[ $parts == *" $1 "* ]]; }
results=${OUT:-/tmp/gpu-rehearsal-out}
work=${GPU_REHEARSAL_WORK:-/tmp/gpu-rehearsal}
out=$work/out  # what it saw, packed into $results/rehearsal.tar.gz at the end
rm -rf "$out"
mkdir -p "$results" "$out"
exec > >(tee "$results/rehearsal.log") 2>&1
events=$out/events.tsv  # stage <tab> seconds since the start <tab> detail: what report.py reads
: >"$events"
since() { awk -v now="$EPOCHREALTIME" -v t="$1" 'BEGIN { printf "%.1f", now - t }'; }
t0=$EPOCHREALTIME
mark() { printf '%s\t%s\t%s\n' "$1" "$(since "$t0")" "${2:-}" >>"$events"; echo "== $1 ${2:-}"; }
pack() { tar -C "$out" -czf "$results/rehearsal.tar.gz" .; }
fail() { echo "rehearse.sh: $*" >&2; mark failed "$*"; pack; exit 1; }

# --- install --------------------------------------------------------------------------------------------------
site=$work/site
# verl 0.9.1's install outlives the call that made it (the machine is held between calls): kept while its stamp,
# the parts' manifest, is the one here
v091_parts=${V091_PARTS:-.whl/v091}
if want train || want judge || want cases || want sft || want pipeline || want sft-two \
  || ! cmp -s "$site/.v091-parts.json" .whl/v091/v091.tar.parts.json; then
  rm -rf "${site:?}"
fi
rm -rf "${work:?}"/verl-* "${work:?}"/bin "${work:?}"/serve
mkdir -p "$site" "$work"/bin
printf '#!/bin/sh\nexec python3 -c "import sys; from ray.scripts.scripts import main; sys.argv[0] = \\"ray\\"; main()" "$@"\n' \
  >"$work"/bin/ray
# vLLM's command (a service's `vllm serve`): its console script, which an unpacked tarball does not bring
printf '#!/bin/sh\nexec python3 -c "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = \\"vllm\\"; sys.exit(main())" "$@"\n' \
  >"$work"/bin/vllm
printf '#!/bin/sh\nexec python3 -P -m verlc "$@"\n' >"$work"/bin/verlc  # -P: not the source folder verlc/
chmod +x "$work"/bin/*
export PATH=$work/bin:$PATH
if want train || want judge || want cases || want sft || want pipeline || want sft-two; then
  # verl 0.5.0 and 0.6.1: the wheels into folders of their own, the two releases apart
  python3 dev/gpu/wheel_matches.py .whl/common/verlc-*.whl \
    || fail "the verlc wheel in .whl/common is not this working tree's: run dev/gpu/wheels.sh here first"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/common/*.whl || fail "pip install"
  tar -C "$site" -xJf .whl/ray.tar.xz || fail "unpacking ray"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/serve" .whl/serve/*.whl \
    || fail "pip install the judge's serving packages"
  export GPU_REHEARSAL_SERVE=$work/serve  # the judge service's PYTHONPATH (specs/gpu-rehearsal-judge.yaml)
  for release in 0.5.0 0.6.1; do
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/verl-$release" \
      .whl/verl-"$release"/*.whl || fail "pip install verl $release"
  done
  # the stand-in for flash-attn: what verl 0.5.0's actor imports on CUDA (dev/gpu/standin/flash_attn)
  standin=$PWD/dev/gpu/standin
  use_release() { export PYTHONPATH=$work/verl-$1:$site:$standin; }
  use_release 0.5.0
else
  # verl 0.9.1 with vLLM: the parts that earlier calls carried (in V091_PARTS) and this one's, joined, then
  # unpacked into one folder; verlc from this working tree
  if [[ ! -f $site/.v091-parts.json ]]; then
    [[ $v091_parts -ef .whl/v091 ]] || cp .whl/v091/* "$v091_parts"/ 2>/dev/null
    python3 dev/gpu/parts.py join "$v091_parts"/v091.tar.parts.json "$work"/v091.tar || fail "the v091 parts"
    rm -rf "$work"/v091 && mkdir -p "$work"/v091
    tar -C "$work"/v091 -xf "$work"/v091.tar || fail "unpacking the v091 bundle"
    rm "$work"/v091.tar
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$work"/v091/wheels/*.whl \
      || fail "pip install (v091)"
    for big in vllm ray; do tar -C "$site" -xJf "$work/v091/$big.tar.xz" || fail "unpacking $big"; done
    cp .whl/v091/v091.tar.parts.json "$site/.v091-parts.json"
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$site" . \
    || fail "pip install verlc"
  rm -rf build
  export PYTHONPATH=$site
  # no network there: nothing asks the hub or reports usage
  export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  # FlashInfer is left out of the install (dev/gpu/wheels.sh), and vLLM 0.24's sampler imports it at start unless
  # told not to (vllm/v1/sample/ops/topk_topp_sampler.py): a `vllm serve` judge died of it (docs/gpu.md); verl's
  # rollout asks for processed log-probs, which never reach it
  export VLLM_USE_FLASHINFER_SAMPLER=0
fi
mark installed
python3 - <<'EOF' | tee "$out/versions.txt"
import platform, subprocess
from importlib.metadata import version
import torch
print("python", platform.python_version())
for name in ("verl", "ray", "torch", "transformers", "tensordict", "hydra-core", "vllm", "verlc"):
    try:
        print(name, version(name))
    except Exception:
        print(name, "none")
print("gpu", torch.cuda.get_device_name(0), "x", torch.cuda.device_count())
print("driver", subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True).stdout.strip())
EOF

# --- the tiny model and data, offline ----------------------------------------------------------------------------
export GPU_REHEARSAL=$work/fixtures
# made again unless this fixtures.py made them; the checkpoints stay (a later call's part resumes from them)
if ! cmp -s "$GPU_REHEARSAL/fixtures.py" dev/gpu/fixtures.py; then
  rm -rf "${GPU_REHEARSAL:?}"/{model,model-*,data,hub}
  python3 dev/gpu/fixtures.py "$GPU_REHEARSAL" || fail "fixtures"
  cp dev/gpu/fixtures.py "$GPU_REHEARSAL"/
fi
fits=()  # the model shapes this call's parts run (made once: minutes each)
for part in $parts; do
  case $part in vllm-fit*) fits+=("dev/gpu/fit${part#vllm-fit}.yaml") ;; vllm-oom*) fits+=(dev/gpu/fit.yaml) ;; esac
done
((${#fits[@]} == 0)) || python3 dev/gpu/fixtures.py "$GPU_REHEARSAL" "${fits[@]}" || fail "fixtures (model shapes)"
cp specs/gpu-rehearsal/reward.py specs/genrm/judge_reward.py "$GPU_REHEARSAL"/
mark fixtures

# The ledger (runs.jsonl) is kept at the git root: a copy without .git gets its own.
if [[ ! -d .git ]]; then
  git init -q && git add -A && git -c user.name=rehearsal -c user.email=rehearsal@localhost commit -qm rehearsal
fi
rm -f runs.jsonl

# --- a one-node Ray head (its environment is the job's: PYTHONPATH, GPU_REHEARSAL) ---------------------------
ray_up() {
  ray stop --force >/dev/null 2>&1
  ray start --head --num-gpus=1 --dashboard-host=127.0.0.1 --include-dashboard=true --disable-usage-stats \
    --temp-dir="$work/ray" >"$out/ray-start.log" 2>&1 || { cat "$out/ray-start.log"; fail "ray start"; }
  for _ in $(seq 60); do curl -sf http://127.0.0.1:8265/api/version >/dev/null && return 0; sleep 1; done
  fail "Ray's dashboard did not answer"
}
# NVLink multicast stays off on the lent machines (/work/.library/device/KINDS.md), in every process Ray starts
export RAY_ADDRESS=http://127.0.0.1:8265 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ray_up
mark ray-head

# submit SPEC LABEL [METRIC]: verlc submit --follow, each output line stamped with seconds since the submit
submit() {
  local spec=$1 label=$2 metric=${3:-critic/score/mean} start rc
  start=$EPOCHREALTIME
  verlc submit "$spec" --target ray-job --follow --metric "$metric" 2>&1 |
    while IFS= read -r line; do printf '%s %s\n' "$(since "$start")" "$line"; done >"$out/$label.follow"
  rc=${PIPESTATUS[0]}
  cat "$out/$label.follow"
  run=$(sed -n 's/^[0-9.]* submitted \([^ ]*\) .*/\1/p' "$out/$label.follow" | head -n 1)  # read by the caller
  [[ -n $run ]] && verlc logs "$run" >"$out/$label.log" 2>&1
  # a failed run's last lines in this log too: it comes back from the device call even when the pack does not
  ((rc == 0)) || { echo "--- the last 80 lines of $label's job log"; tail -n 80 "$out/$label.log"; }
  mark "$label" "exit $rc run ${run:-none}"
}

# what holds the GPU: pid, MiB, command line
gpu_users() {
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | while IFS=', ' read -r pid mib; do
    printf '%s\t%s\t%s\n' "$pid" "$mib" "$(ps -o args= -p "$pid" | cut -c1-160)"
  done
}

# build SPEC LABEL: a spec the build must refuse
build() {
  local rc
  verlc build "$1" --target ray-job --out "$work/refused" >"$out/$2.build" 2>&1
  rc=$?
  cat "$out/$2.build"
  mark "$2" "exit $rc"
}

if want train; then
  submit specs/gpu-rehearsal-reinforce.yaml train
  verlc runs --results "$run" --format markdown >"$out/results.md" 2>&1
  cat "$out/results.md"
  verlc plot "$run" --metric critic/score/mean -o "$results/gpu-rehearsal.svg"
  verlc runs --timeline "$run" --format markdown >"$out/timeline.md" 2>&1
  cat "$out/timeline.md"
  verlc plot "$run" --timeline -o "$results/gpu-timeline.svg"  # now: the next Ray head forgets this run's log
  ls -R "$GPU_REHEARSAL/checkpoints" >"$out/checkpoints.txt" 2>&1
fi
if want judge; then  # the judge beside the trainer: which processes hold the GPU, sampled every 2 s meanwhile
  (while sleep 2; do echo "at $(since "$t0")"; gpu_users; done) >"$out/judge-gpu.txt" 2>&1 &
  sampler=$!
  submit specs/gpu-rehearsal-judge.yaml judge
  kill "$sampler"
  verlc logs "$run" --service judge >"$out/judge-service.log" 2>&1  # through Ray's log API (a ray-job)
  verlc runs --timeline "$run" --format markdown >"$out/judge-timeline.md" 2>&1
  cat "$out/judge-timeline.md"
fi
if want cases; then
  submit dev/gpu/cases/critic-0.5.0.yaml critic
  build dev/gpu/cases/hf-rollout-n4-0.5.0.yaml hf-n4
  build dev/gpu/cases/hf-rollout-0.6.1.yaml hf-0.6.1
fi
if want vllm; then  # verl 0.9.1 with vLLM 0.24.0: which processes hold the GPU, sampled every 2 s meanwhile
  rm -rf "$GPU_REHEARSAL/checkpoints/vllm"
  (while sleep 2; do echo "at $(since "$t0")"; gpu_users; done) >"$out/vllm-gpu.txt" 2>&1 &
  sampler=$!
  submit specs/gpu-rehearsal-vllm.yaml vllm
  kill "$sampler"
  verlc runs --results "$run" --format markdown >"$out/vllm-results.md" 2>&1
  verlc runs --timeline "$run" --format markdown >"$out/vllm-timeline.md" 2>&1
  cat "$out/vllm-results.md" "$out/vllm-timeline.md"
  ls -R "$GPU_REHEARSAL/checkpoints/vllm" >"$out/vllm-checkpoints.txt" 2>&1
fi
if want vllm-resume; then  # the same run again: it resumes from the last checkpoint (trainer.resume_mode auto)
  submit specs/gpu-rehearsal-vllm.yaml vllm-resume
fi
# will it fit: the plan beside what verl's actor measured (perf/max_memory_allocated_gb) and nvidia-smi saw, for
# each model shape asked for (vllm-fit: dev/gpu/fit.yaml; vllm-fit-3b: dev/gpu/fit-3b.yaml, ...)
for part in $parts; do
  [[ $part == vllm-fit* ]] || continue
  label=fit${part#vllm-fit}
  spec=dev/gpu/$label.yaml
  verlc plan "$spec" --format json >"$out/$label-plan.json" 2>"$out/$label-plan.err"
  (while sleep 1; do echo "at $(since "$t0")"; gpu_users; done) >"$out/$label-gpu.txt" 2>&1 &
  sampler=$!
  submit "$spec" "$label" perf/max_memory_allocated_gb
  kill "$sampler"
  verlc runs --results "$run" --metric perf/ --format json >"$out/$label-results.json" 2>&1
  nvidia-smi >"$out/$label-nvidia-smi.txt" 2>&1
  # vLLM's own memory figures (its weights, the profile, the KV cache, its CUDA graphs), from its workers' logs
  vllm_lines='Model loading took|[Pp]rofil.*GiB|KV cache|Graph capturing finished|CUDA graph|cudagraph|first-capture'
  grep -h -a -E "$vllm_lines" "$work"/ray/session_latest/logs/worker-*.{out,err} >"$out/$label-vllm-memory.txt" \
    2>/dev/null
  # verl's, at DEBUG (log_gpu_memory_usage around the weight sync, the update, the offload): the job log has what
  # Ray forwarded, the workers' own files the rest
  grep -h -a -E 'memory allocated \(GB\)' "$out/$label.log" "$work"/ray/session_latest/logs/worker-*.{out,err} \
    >"$out/$label-verl-memory.txt" 2>/dev/null
done
if want vllm-oom; then  # a run the plan says does not fit the H100 (dev/gpu/fit-oom.yaml, declared on an H200)
  submit dev/gpu/fit-oom.yaml oom-preflight  # the preflight must refuse it: a smaller card than declared
fi
if want vllm-oom-direct; then  # verl's own trainer command of that bundle, without verlc's runtime: where it stops
  verlc build dev/gpu/fit-oom.yaml --target ray-job --out "$work/oom" >"$out/oom-build.txt" 2>&1
  bundle=$(dirname "$(find "$work/oom" -name job.json)")
  env_json=$(python3 -c 'import json, sys, yaml
print(json.dumps({"env_vars": yaml.safe_load(open(sys.argv[1]))["env_vars"]}))' "$bundle/../runtime_env.yaml")
  # NUL-separated: an argument may hold a newline
  mapfile -d '' -t argv < <(python3 -c 'import json, sys
print(*json.load(open(sys.argv[1]))["train"], sep="\0", end="\0")' "$bundle/job.json")
  (while sleep 2; do echo "at $(since "$t0")"; gpu_users; done) >"$out/oom-gpu.txt" 2>&1 &
  sampler=$!
  start=$EPOCHREALTIME
  timeout 480 ray job submit --runtime-env-json "$env_json" -- "${argv[@]}" 2>&1 |
    while IFS= read -r line; do printf '%s %s\n' "$(since "$start")" "$line"; done | tee "$out/oom-direct.log" |
    grep -a -i -E 'out of memory|OutOfMemory|Free memory|step:|Traceback|Error|wake|sleep'
  rc=${PIPESTATUS[0]}
  ((rc == 124)) && ray job list >>"$out/oom-direct.log" 2>&1  # a trainer that hung after the error
  kill "$sampler"
  tail -n 40 "$out/oom-direct.log"
  mark oom-direct "exit $rc after $(since "$start") s"
fi
if want vllm-judge; then  # the judge as `vllm serve` on the rollout's GPU, its share the spec's gpu_memory
  submit specs/gpu-rehearsal-vllm-judge.yaml vllm-judge
  verlc logs "$run" --service judge >"$out/vllm-judge-service.log" 2>&1
fi
if want vllm-cases; then
  for case in dev/gpu/cases/*-0.9.1.yaml; do
    label=$(basename "$case" .yaml)
    if grep -q '^# expect: build' "$case"; then build "$case" "$label"; else submit "$case" "$label"; fi
  done
fi
declare -F use_release >/dev/null || { ray stop --force >/dev/null 2>&1; mark finished; pack; exit 0; }
use_release 0.6.1
ray_up
want cases && submit dev/gpu/cases/vllm-missing-0.6.1.yaml vllm-0.6.1
if want sft; then
  submit specs/gpu-rehearsal-sft.yaml sft train/loss  # verl 0.6.1's SFT trainer under torchrun
  verlc runs --timeline "$run" --format markdown >"$out/sft-timeline.md" 2>&1
  ls -R "$GPU_REHEARSAL/checkpoints/sft" >"$out/sft-checkpoints.txt" 2>&1
fi
if want pipeline; then  # in one Ray job: SFT, verl's merger on its last checkpoint, a stage from the merged model
  submit specs/pipelines/gpu-rehearsal-pipeline.yaml pipeline train/loss
  ls -lR "$GPU_REHEARSAL"/checkpoints/pipeline-* >"$out/pipeline-checkpoints.txt" 2>&1
fi
# SFT on two nodes, where the machine has two GPUs: a second Ray node on this host, each node with a GPU of its
# own (Ray gives a node's tasks the GPUs its CUDA_VISIBLE_DEVICES names), as two hosts would be
if want sft-two && (($(nvidia-smi -L | grep -c '^GPU ') >= 2)); then
  ray stop --force >/dev/null 2>&1
  CUDA_VISIBLE_DEVICES=0 ray_up
  CUDA_VISIBLE_DEVICES=1 ray start --address=127.0.0.1:6379 --num-gpus=1 --disable-usage-stats \
    >"$out/ray-start-second.log" 2>&1 || { cat "$out/ray-start-second.log"; fail "ray start (the second node)"; }
  mark ray-two-nodes
  submit specs/gpu-rehearsal-sft-two-nodes.yaml sft-two train/loss
  ls -R "$GPU_REHEARSAL/checkpoints/sft-two-nodes" >"$out/sft-two-checkpoints.txt" 2>&1
elif want sft-two; then
  mark sft-two "skipped: one GPU"
fi
ray stop --force >/dev/null 2>&1
mark finished
cp "$results/gpu-rehearsal.svg" "$results/gpu-timeline.svg" "$out/" 2>/dev/null
want train && python3 dev/gpu/report.py "$out" "$results/gpu.md"
pack
