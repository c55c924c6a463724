"""The GenRM example's reward (specs/genrm-judge.yaml): an LLM judge, served beside the trainer, says whether each
response matches the reference answer. verlc gives every process of the job the judge's address and this run's
token (VERLC_SERVICE_JUDGE_URL, VERLC_SERVICE_JUDGE_TOKEN); a judge that cannot be reached fails the step loudly
instead of scoring the response 0 or 1 unseen."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

MODEL = "genrm"  # the judge's --served-model-name (services.judge.probe.model)
ATTEMPTS = 3
TIMEOUT = 60  # seconds a request may take

PROMPT = ("Reference answer: {reference}\n\nResponse: {response}\n\n"
          "Does the response reach the reference answer? Answer with one word, yes or no.")


def ask(prompt: str) -> str:
    """The judge's answer to one message, asked up to ATTEMPTS times."""
    request = urllib.request.Request(
        os.environ["VERLC_SERVICE_JUDGE_URL"] + "/v1/chat/completions",
        data=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4,
                         "temperature": 0}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": f"Bearer {os.environ['VERLC_SERVICE_JUDGE_TOKEN']}"})
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                return json.load(answer)["choices"][0]["message"]["content"] or ""
        except (urllib.error.URLError, TimeoutError, KeyError, ValueError):
            if attempt == ATTEMPTS:
                raise
            time.sleep(2 * attempt)
    raise AssertionError("unreachable")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 where the judge says the response reaches the reference answer, else 0.0."""
    said = ask(PROMPT.format(reference=ground_truth, response=solution_str[-4000:]))
    return 1.0 if said.strip().lower().startswith("yes") else 0.0
