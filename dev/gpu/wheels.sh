#!/usr/bin/env bash
# The wheels the GPU rehearsal installs on a machine with no network (dev/gpu/rehearse.sh), fetched here into
# .whl/ (git-ignored; at most 64 MiB travel to the device machine with the working tree). The machine has
# Python 3.12 with torch, numpy, pandas, pyarrow, jinja2, aiohttp, matplotlib and more (docs/gpu.md): these are
# what verl 0.5.0 / 0.6.1, Ray's Jobs API and verlc add to it. Idempotent.
#
#   bash dev/gpu/wheels.sh      # then: the device tool runs dev/gpu/rehearse.sh with .whl carried
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-.venv/bin/python}
out=.whl
mkdir -p "$out"/common "$out"/verl-0.5.0 "$out"/verl-0.6.1 "$out"/serve

fetch() {  # fetch DIR NAME==VERSION...: Linux x86-64 wheels for CPython 3.12, no dependencies
  local dir=$1
  shift
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$dir" "$@"
}

# verl and the one package whose version differs between the two releases the rehearsal runs
fetch "$out"/verl-0.5.0 verl==0.5.0 tensordict==0.9.1
fetch "$out"/verl-0.6.1 verl==0.6.1 tensordict==0.10.0
# what verl imports that the machine lacks; its transformers 5 has no AutoModelForVision2Seq, which 0.5/0.6 import
fetch "$out"/common hydra-core==1.3.2 omegaconf==2.3.0 pyvers==0.1.0 codetiming==1.4.0 datasets==3.6.0 \
  dill==0.3.8 multiprocess==0.70.16 pylatexenc==2.11 torchdata==0.11.0 orjson==3.10.18 \
  transformers==4.57.1 tokenizers==0.22.1 huggingface_hub==0.36.0
# Ray's Jobs API (ray[default]'s dashboard) and verlc's own needs (pydantic, ruamel.yaml)
fetch "$out"/common aiohttp_cors==0.8.1 colorful==0.5.6 opencensus==0.11.4 opencensus-context==0.1.3 \
  opentelemetry-api==1.34.1 opentelemetry-sdk==1.34.1 opentelemetry-proto==1.34.1 \
  opentelemetry-exporter-prometheus==0.55b1 opentelemetry-semantic-conventions==0.55b1 \
  pydantic==2.11.7 pydantic-core==2.33.2 annotated-types==0.7.0 typing-inspection==0.4.1 smart_open==7.3.0 \
  google-api-core==2.25.1 googleapis-common-protos==1.70.0 proto-plus==1.26.1 google-auth==2.40.3 \
  cachetools==5.5.2 pyasn1==0.6.1 pyasn1-modules==0.4.2 rsa==4.9.1 jsonschema==4.24.0 \
  jsonschema-specifications==2025.4.1 referencing==0.36.2 rpds-py==0.26.0 ruamel.yaml==0.18.14 \
  ruamel.yaml.clib==0.2.12 importlib_metadata==8.7.0
# what `transformers serve` (the judge service of specs/gpu-rehearsal-judge.yaml) needs beside the machine's own
# transformers 5, apart: on the service's PYTHONPATH only, never the trainer's (verl 0.5/0.6 need transformers 4)
fetch "$out"/serve fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 openai==3.63.0 pydantic==2.14.4 \
  pydantic-core==2.50.5 annotated-types==0.8.0 annotated-doc==0.0.7 typing-inspection==0.4.5 \
  typing-extensions==4.16.0 jiter==0.19.0 sniffio==1.3.1 httpx2==2.17.0 httpcore2==2.17.0 truststore==0.10.5 \
  opentelemetry-api==1.45.3
# antlr4 4.9.3 (Hydra's) has only a source distribution: a pure-Python wheel built here
[[ -n $(compgen -G "$out/common/antlr4_python3_runtime-*.whl") ]] ||
  "$python" -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$out"/common antlr4-python3-runtime==4.9.3
# verlc itself, from this working tree
rm -f "$out"/common/verlc-*.whl
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w "$out"/common .
rm -rf build

# Ray's wheel is 70 MB: without its Java jars and RLlib (neither is used) and packed with xz, about a third
if [[ ! -f $out/ray.tar.xz ]]; then
  scratch=$(mktemp -d)
  fetch "$scratch" ray==2.49.2
  mkdir "$scratch"/site
  (cd "$scratch"/site && unzip -q ../ray-*.whl && rm -rf ray/jars ray/rllib)
  tar -C "$scratch"/site -cJf "$out"/ray.tar.xz .
  rm -rf "$scratch"
fi
du -sh "$out"
