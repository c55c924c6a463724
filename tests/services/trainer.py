"""A stand-in trainer for the services tests (there is no GPU here: it trains nothing and says so): it reads its
Hydra overrides as verl would (OmegaConf resolves ${oc.env:...} in this process), then calls the sandbox at the
URL verl's reward.sandbox_fusion.url got (with the run's token of the sandbox, from its env: the test's sandbox
refuses a request without it), the retriever at the URL its env got, and, where the spec has a tool config, the
retriever again at the URL that file gives its tool (read as verl's tool registry reads it); it fails if one
does not answer as it must. It adds the token it was given to token.seen, for the test to look for it where it
must not be. With TRAINER_WAITS_FOR_REQUEUE set, a first Slurm attempt then waits (to be requeued) instead of
ending."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

from omegaconf import OmegaConf


def post(url: str, body: dict, token: str = "") -> dict:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


overrides = [a.replace("'", "") for a in sys.argv[1:] if "=" in a and not a.startswith("-")]
config = OmegaConf.to_container(OmegaConf.from_dotlist(overrides), resolve=True)
sandbox = config["reward"]["sandbox_fusion"]["url"]
token = os.environ["VERLC_SERVICE_SANDBOX_TOKEN"]
with open(os.environ.get("TOKEN_SEEN", "token.seen"), "a") as seen:  # the ray-job's cwd is Ray's copy of it
    seen.write(token + "\n")
ran = post(sandbox, {"code": "print(6 * 7)", "language": "python"}, token)
print(f"STAND-IN TRAINER (no GPU, nothing trained): sandbox at {sandbox} printed {ran['run_result']['stdout'].strip()}",
      flush=True)
retriever = os.environ["VERLC_SERVICE_RETRIEVER_URL"] + "/retrieve"
found = post(retriever, {"queries": ["policy gradient"], "topk": 1, "return_scores": True})["result"][0]
print(f"STAND-IN TRAINER: retriever at {retriever} found {found[0]['document']['id']}", flush=True)
tools_path = config.get("actor_rollout_ref", {}).get("rollout", {}).get("multi_turn", {}).get("tool_config_path")
if tools_path:  # as verl's tool registry reads it: OmegaConf.load, then each tool's config resolved
    tool = OmegaConf.to_container(OmegaConf.load(tools_path).tools[0].config, resolve=True)
    searched = post(tool["retrieval_service_url"], {"queries": ["clip ratio"], "topk": tool["topk"],
                                                    "return_scores": True})["result"][0]
    print(f"STAND-IN TRAINER: the tool config at {tools_path} reached the retriever at "
          f"{tool['retrieval_service_url']}: {searched[0]['document']['id']}", flush=True)
if os.environ.get("TRAINER_WAITS_FOR_REQUEUE") and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
    print("STAND-IN TRAINER: waiting to be requeued", flush=True)
    time.sleep(600)
sys.exit(0 if ran["run_result"]["stdout"].strip() == "42" else 1)
