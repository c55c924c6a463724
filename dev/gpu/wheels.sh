#!/usr/bin/env bash
# The wheels the GPU rehearsal installs on a machine with no network (dev/gpu/rehearse.sh), fetched here into
# .whl/ (git-ignored; at most 64 MiB travel to the device machine with the working tree). The machine has
# Python 3.12 with torch, numpy, pandas, pyarrow, jinja2, aiohttp, matplotlib and more (docs/gpu.md): these are
# what verl 0.5.0 / 0.6.1, Ray's Jobs API and verlc add to it. Idempotent.
#
#   bash dev/gpu/wheels.sh      # then: the device tool runs dev/gpu/rehearse.sh with .whl carried
#   bash dev/gpu/wheels.sh vllm # verl 0.9.1 with vLLM 0.24.0 instead: one bundle in 44 MiB parts (.whl/v091/)
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

# verl 0.9.1 with its `vllm` extra's pins (vllm 0.24.0, transformers 5.9.0; torch 2.11.0 is the machine's): about
# 210 MB packed, more than four calls carry, so one tar in parts of 44 MiB (the working tree, 17 MB, takes the rest
# of a call's 64 MiB) with a manifest (dev/gpu/parts.py), each part carried by a call of its own and joined there.
# Left out, as optional at import for a dense model on Hopper: FlashInfer and its cubins (vLLM's sampler falls
# back to its own only with VLLM_USE_FLASHINFER_SAMPLER=0, which rehearse.sh sets), the CUTLASS DSL, TileLang, the MoE and FA2 kernels (vLLM prefers FA3 on SM90), the Rust front end;
# of verl-core, what only vision and video data or its tests use (torchcodec, PyAV, pytest plugins).
if [[ ${1:-} == vllm ]]; then
  bundle=.cache/gpu-v091  # what was fetched and packed stays for the next run; the tar and its parts are remade
  mkdir -p "$bundle"
  # tokenizers 0.22: transformers 5.9.0 checks tokenizers<=0.23.0 at import (the machine has 0.23.2); xgrammar
  # 0.2.9 needs apache-tvm-ffi 0.1.11 (it fails at import with the 0.1.9 vLLM pins for FlashInfer and its CuTe
  # kernels, which are not here); 0.2.5.post1, the newest that takes 0.1.9, is 48 MB
  "$python" dev/gpu/closure.py "$bundle"/wheels 'verl[vllm]==0.9.1' vllm==0.24.0 'ray[default]==2.49.2' transformers==5.9.0 \
    'tokenizers>=0.22,<=0.23.0' tensordict==0.10.0 ruamel.yaml==0.18.14 'apache-tvm-ffi>=0.1.11,<0.2' xgrammar==0.2.9 \
    --skip torch torchvision torchaudio numba wandb mbridge torchcodec av pytest-asyncio pytest-rerunfailures \
    flashinfer-python flashinfer-cubin tilelang nvidia-cudnn-frontend fastsafetensors \
    nvidia-cutlass-dsl quack-kernels tokenspeed-mla humming-kernels >"$bundle"/closure.log
  for big in vllm ray; do  # unpacked, pruned, packed with xz, outside the wheels folder
    [[ -f $bundle/$big.tar.xz ]] && continue
    rm -rf "${bundle:?}/$big" && mkdir "$bundle/$big"
    (cd "$bundle/$big" && unzip -q ../wheels/"$big"-*.whl)
    rm -rf "$bundle"/ray/ray/jars "$bundle"/ray/ray/rllib "$bundle"/vllm/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so \
      "$bundle"/vllm/vllm/_moe_C_stable_libtorch.abi3.so "$bundle"/vllm/vllm/vllm-rs \
      "$bundle"/vllm/vllm/third_party/fmha_sm100 "$bundle"/vllm/vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-*.so
    XZ_OPT="-6 -T2" tar -C "$bundle/$big" -cJf "$bundle/$big.tar.xz.partial" . && mv "$bundle/$big.tar.xz"{.partial,}
    rm -rf "${bundle:?}/$big"
  done
  # verlc is not in it: the rehearsal installs it from the working tree that travels with each call
  # the wheels of this closure (the folder may hold others, of an earlier one)
  sed -n 's/^\([^ ]*\.whl\) .*/wheels\/\1/p' "$bundle"/wheels/closure.txt | grep -v -e '^wheels/vllm-' -e '^wheels/ray-' \
    >"$bundle"/members.txt
  tar -C "$bundle" -cf "$bundle"/v091.tar -T "$bundle"/members.txt vllm.tar.xz ray.tar.xz
  rm -rf "$out"/v091
  "$python" dev/gpu/parts.py split "$bundle"/v091.tar "$out"/v091 --size 44
  rm "$bundle"/v091.tar
  "$python" dev/gpu/parts.py calls "$out"/v091 --budget 44
  exit 0
fi

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
