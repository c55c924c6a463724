#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs everything into .venv, then runs pytest.
# Used by the README, by developers and by .ci/run. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
# The Debian packages behind the local Slurm cluster, podman and the editor tests, once, before any pytest
# process starts (two at once would race for apt's lock). Outside CI a machine without root runs on, and the
# tests that need a missing tool skip.
bash dev/packages.sh || [[ ${CI:-} != true ]]
# The container tests' image (dev/containers.sh image: debootstrap and pip, mostly downloads, 160 s on a fresh
# machine), built beside the installs below instead of inside the first container test. The tests' own call
# waits for it (the script's lock) and builds it again, saying why, where this one failed; its log is kept.
image_log=$(mktemp)
bash dev/containers.sh image >"$image_log" 2>&1 &
image_build=$!
# `|| true`: errexit holds inside the trap too, and the build has mostly ended (and been waited for) by the exit,
# so a failing kill would turn the suite's exit 0 into 1.
trap 'kill "$image_build" 2>/dev/null || true; rm -f "$image_log" "${others_log:-}"' EXIT
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
# Pin the CPU build of torch before verl asks for "torch": the plain name pulls GBs of CUDA wheels.
.venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
# The README's first command installs verlc into this venv as a regular package, and a build with it leaves its
# compiled templates in site-packages/verlc/ (targets/jinja.py), which pip's uninstall keeps: that folder would
# then shadow the editable install below as a namespace package. Removed with the regular install.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [[ -d $site/verlc ]] && ! compgen -G "$site/__editable__.verlc-*.pth" >/dev/null; then
  .venv/bin/pip uninstall --quiet --yes verlc
  rm -rf "${site:?}/verlc"
fi
.venv/bin/pip install --quiet --disable-pip-version-check -c dev/constraints.txt -e '.[test]'
# SkyPilot's own task parser (tests/test_skypilot.py), in a venv of its own: its click pin clashes with verl's.
if [[ ! -x .cache/sky/bin/python ]]; then
  "$python" -m venv .cache/sky
  .cache/sky/bin/pip install --quiet --disable-pip-version-check skypilot==0.14.1
fi
# The editors' YAML language server (npm), which tests/test_editor.py drives as an editor does.
if command -v npm >/dev/null && [[ ! -x .cache/yls/node_modules/.bin/yaml-language-server ]]; then
  npm install --silent --no-audit --no-fund --prefix .cache/yls yaml-language-server@1.25.0
fi

# Two pytest processes side by side: the tests that start Slurm, Ray or podman on this machine (marked `machine` by
# tests/conftest.py) one at a time in this one, and every other test in a second, whose output follows this
# one's. One machine test at a time: two at once (the Slurm cluster's jobs beside a Ray head or podman's
# containers) took both cores between them, and Ray's own start-up deadlines (a raylet registers within 30 s,
# hard-coded) and the tests' waits were missed on CI's machine; one at a time they ran 38:52 here on
# 2026-12-07 (73 tests; verl 0.9.1's start-up needs are checked on every node of every job), the others 25:34
# beside them, with the installs already done (44:18 earlier that day, before the test cluster's SlurmdTimeout and
# backfill interval came down: dev/slurm.sh, and two tests were trimmed). On 2026-12-08, from a new checkout and
# with nothing else running, the same 73 took 43:01 (the others 28:40): over the 40-minute bar, the side-by-side
# Slurm batch (339 s) and the network faults test (345 s) the largest. A side that selects no test (e.g.
# `dev/test.sh tests/test_diff.py`) exits 5; both doing so is a failure.
others_log=$(mktemp)
# The tests beside the machine tests only compute: they yield the CPU (nice) to the daemons of the machine tests.
nice -n 10 .venv/bin/python -m pytest -p no:cacheprovider -m "not machine" "$@" > "$others_log" 2>&1 &
others=$!
set +e
.venv/bin/python -m pytest -m machine "$@"
machine_rc=$?
wait "$others"
others_rc=$?
wait "$image_build" || echo "dev/test.sh: the image built beside the installs failed: $(tail -n 3 "$image_log")"
set -e
echo "==================== the tests beside them (not machine) ===================="
cat "$others_log"
echo "dev/test.sh: machine tests exit $machine_rc, the others exit $others_rc"
if ((machine_rc == 5 && others_rc == 5)); then
  echo "dev/test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
for rc in "$machine_rc" "$others_rc"; do
  if ((rc != 0 && rc != 5)); then
    exit "$rc"
  fi
done
exit 0
