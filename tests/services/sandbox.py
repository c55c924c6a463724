"""A code sandbox with SandboxFusion's request and answer shape (POST /run_code), for the tests: each request's
Python runs in a subprocess of its own, with limits on CPU time, memory and wall time. SANDBOX_BROKEN=1 makes it
answer every run with empty output (a sandbox that runs nothing, as verl #7853's scored a crash 1.0). With
--token-env NAME it runs code only for a request that carries $NAME as its bearer token (401 otherwise)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def limits() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (5, 5))
    resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))


def run(code: str) -> dict:
    try:
        done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=10,
                              preexec_fn=limits, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "stdout": "", "stderr": ""}}
    stdout = "" if os.environ.get("SANDBOX_BROKEN") else done.stdout
    return {"status": "Success" if done.returncode == 0 else "Failed",
            "run_result": {"status": "Finished", "return_code": done.returncode, "stdout": stdout,
                           "stderr": done.stderr}}


class Handler(BaseHTTPRequestHandler):
    token: str | None = None

    def answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self.answer(200, {"status": "ok"}) if self.path == "/health" else self.answer(404, {"error": self.path})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/run_code":
            return self.answer(404, {"error": self.path})
        if self.token is not None and self.headers.get("Authorization") != f"Bearer {self.token}":
            return self.answer(401, {"error": "a bearer token is required"})
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if request.get("language") != "python":
            return self.answer(400, {"error": f"language {request.get('language')!r} is not served here"})
        self.answer(200, run(str(request.get("code", ""))))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-env", help="the environment variable that holds the token requests must carry")
    a = parser.parse_args()
    Handler.token = os.environ[a.token_env] if a.token_env else None
    print(f"sandbox listening on {a.host}:{a.port}", flush=True)
    ThreadingHTTPServer((a.host, a.port), Handler).serve_forever()
