"""A retriever with Search-R1's request and answer shape (POST /retrieve with queries and topk; a result list per
query of {"document": {"id", "contents"}, "score"}), for the tests: a BM25 index (k1 1.5, b 0.75) over a JSONL
corpus of {"id", "contents"} lines, built at start-up."""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

K1, B = 1.5, 0.75


def tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class Index:
    def __init__(self, documents: list[dict]) -> None:
        self.documents = documents
        self.terms = [Counter(tokens(d["contents"])) for d in documents]
        self.lengths = [sum(t.values()) for t in self.terms]
        self.average = sum(self.lengths) / max(len(self.lengths), 1)
        frequency = Counter(term for t in self.terms for term in t)
        n = len(documents)
        self.idf = {term: math.log(1 + (n - f + 0.5) / (f + 0.5)) for term, f in frequency.items()}

    def search(self, query: str, k: int) -> list[tuple[dict, float]]:
        scores = []
        for doc, terms, length in zip(self.documents, self.terms, self.lengths):
            score = sum(self.idf.get(q, 0.0) * terms[q] * (K1 + 1)
                        / (terms[q] + K1 * (1 - B + B * length / self.average)) for q in tokens(query) if q in terms)
            if score > 0:
                scores.append((doc, score))
        return sorted(scores, key=lambda pair: -pair[1])[:k]


def handler(index: Index) -> type:
    class Handler(BaseHTTPRequestHandler):
        def answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/retrieve":
                return self.answer(404, {"error": self.path})
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            k, scores = int(request.get("topk", 3)), bool(request.get("return_scores"))
            result = [[{"document": d, "score": s} if scores else d for d, s in index.search(q, k)]
                      for q in request.get("queries", [])]
            self.answer(200, {"result": result})

    return Handler


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--corpus", required=True)
    a = parser.parse_args()
    with open(a.corpus, encoding="utf-8") as fh:
        index = Index([json.loads(line) for line in fh if line.strip()])
    print(f"retriever: {len(index.documents)} documents, listening on {a.host}:{a.port}", flush=True)
    ThreadingHTTPServer((a.host, a.port), handler(index)).serve_forever()
