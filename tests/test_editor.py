"""Help for every verl key where specs are written: the per-release JSON Schemas (schema/verl-<release>.json)
are what `verlc schema` generates, agree with verlc's own verdict on keys, and drive a real editor's
language server (yaml-language-server, from npm): completion, hover and a mistyped key's diagnostic."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ruamel.yaml import YAML

from conftest import IN_CI, MAIN_PPO_SPECS, REPO, SPECS, run_verlc
from test_verl_releases import leaves, nest
from verlc.compiler import spec_doc
from verlc.compiler.diagnostics import SpecError
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.compiler.verl.release import MISSING, RELEASES, snapshot

SCHEMAS = REPO / "schema"
YLS = REPO / ".cache" / "yls" / "node_modules" / "yaml-language-server" / "bin" / "yaml-language-server"


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_schema_is_fresh(version: str) -> None:
    path = SCHEMAS / f"verl-{version}.json"
    assert path.read_text() == spec_doc.json_schema(CATALOG, version), \
        f"{path.name} is stale: run verlc schema --verl-version {version} > schema/{path.name}"


def test_schema_command_prints_the_release_schema() -> None:
    result = run_verlc("schema", "--verl-version", "0.6.0")
    assert result.returncode == 0 and result.stdout == (SCHEMAS / "verl-0.6.0.json").read_text()
    assert run_verlc("schema").stdout == (SCHEMAS / "verl-0.9.1.json").read_text()
    bad = run_verlc("schema", "--verl-version", "0.6")
    assert bad.returncode == 2 and "no schema for verl 0.6" in bad.stderr


def validator(version: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"verl-{version}.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def errors(version: str, data: dict[str, Any]) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in validator(version).iter_errors(data)]


@pytest.mark.parametrize("spec", MAIN_PPO_SPECS, ids=[p.stem for p in MAIN_PPO_SPECS])
def test_examples_point_at_their_release_schema_and_validate(spec: Path) -> None:
    text = spec.read_text()
    data = YAML(typ="safe", pure=True).load(text)
    version = data.get("verl_version", "0.9.1")
    assert text.startswith(f"# yaml-language-server: $schema=../schema/verl-{version}.json\n")
    assert errors(version, data) == []
    data["verl"]["actor_rollout_ref"]["actor"]["ppo_mini_batch_sise"] = 64
    assert errors(version, data) == ["$.verl.actor_rollout_ref.actor: 'ppo_mini_batch_sise' does not match any of "
                                     "the regexes: '^\\\\+'"]
    data["verl"]["actor_rollout_ref"]["actor"] = {"ppo_mini_batch_size": "sixty-four"}
    assert any("ppo_mini_batch_size" in e and "does not match" in e for e in errors(version, data))


@pytest.mark.parametrize("spec", sorted(set(SPECS) - set(MAIN_PPO_SPECS)),
                         ids=[p.stem for p in sorted(set(SPECS) - set(MAIN_PPO_SPECS))])
def test_program_examples_point_at_their_programs_schema_and_validate(spec: Path) -> None:
    """An example of another program (verl's SFT trainer) points at the schema `verlc schema --spec` writes for
    its program, committed beside it, and validates against it; a misspelled key of that program does not."""
    text = spec.read_text()
    own = spec.with_name(f"{spec.stem}.schema.json")
    assert text.startswith(f"# yaml-language-server: $schema={own.name}\n")
    assert own.read_text() == run_verlc("schema", "--spec", spec).stdout, f"stale: verlc schema --spec {spec} > {own}"
    check = jsonschema.Draft202012Validator(json.loads(own.read_text()))
    data = YAML(typ="safe", pure=True).load(text)
    assert [e.message for e in check.iter_errors(data)] == []
    data["verl"]["data"]["max_lenght"] = 64
    assert any("max_lenght" in e.message for e in check.iter_errors(data))


def base_spec(version: str, verl: dict[str, Any]) -> dict[str, Any]:
    return {"name": "e", "project": "p", "model": "m", "verl_version": version, "verl": verl,
            "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
            "cluster": {"nodes": 1, "gpus_per_node": 8}, "container": {"runtime": "none"}}


def verlc_says(tmp: Path, spec: dict[str, Any]) -> list[str]:
    path = tmp / "spec.json"
    path.write_text(json.dumps(spec))
    try:
        compile_spec(path, CATALOG, display="spec.json", source="spec.json")
    except SpecError as exc:
        return [f"{d.path}: {d.message}" for d in exc.diagnostics]
    return []


@pytest.mark.parametrize("version", RELEASES)
def test_the_schema_takes_every_key_verl_has_and_refuses_what_verlc_refuses(tmp_path: Path, version: str) -> None:
    """Every key of every trainer config and engine, written with its own default, passes the editor's
    schema (an editor must not flag what verl takes); a misspelt key in each section verlc closes is
    flagged by both."""
    release = snapshot(version)
    checked = 0
    for config in release.configs:
        for engine in release.engines(config):
            flat = {k: v for k, v in leaves(release.tree(config, engine)) if v != MISSING and "_target_" not in k}
            spec = base_spec(version, {**nest(flat, {}), **({"model_engine": engine} if engine else {})})
            if config != "ppo_trainer":
                spec["hydra"] = {"config_name": config}
            assert errors(version, spec) == [], f"{config}/{engine}"
            checked += len(flat)
    assert checked > 100
    sections = sorted({k.rsplit(".", 1)[0] for k, _ in leaves(release.tree("ppo_trainer", release.default_engine(
        "ppo_trainer"))) if "." in k and "_target_" not in k})
    disagree = []
    for section in sections[:: max(1, len(sections) // 25)]:  # ~25 sections per release, spread over the tree
        wrong = base_spec(version, nest({f"{section}.verlc_no_such_key": 1}, {}))
        editor, verlc = errors(version, wrong), verlc_says(tmp_path, wrong)
        if bool(editor) != any("verlc_no_such_key" in p for p in verlc):
            disagree.append(f"{section}: editor {editor or 'accepts'}; verlc {verlc or 'accepts'}")
    assert not disagree, "\n".join(disagree)


# --- a real editor: yaml-language-server over the Language Server Protocol -----------------------------


class LanguageServer:
    """A minimal LSP client: requests, notifications, and answers to the server's own requests."""

    SETTINGS = {"validate": True, "hover": True, "completion": True, "schemaStore": {"enable": False}}

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(["node", str(YLS), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.next_id = 0
        self.diagnostics: dict[str, list[dict[str, Any]]] = {}
        self.request("initialize", {"processId": os.getpid(), "rootUri": root.as_uri(),
                                    "capabilities": {"workspace": {"configuration": True}}})
        self.notify("initialized", {})
        self.notify("workspace/didChangeConfiguration", {"settings": {"yaml": self.SETTINGS}})

    def _send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        length = 0
        while line := self.proc.stdout.readline().strip():
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        message = json.loads(self.proc.stdout.read(length))
        if message.get("method") == "workspace/configuration":
            self._send({"id": message["id"], "result": [self.SETTINGS if i.get("section") == "yaml" else None
                                                        for i in message["params"]["items"]]})
        elif "method" in message and "id" in message:
            self._send({"id": message["id"], "result": None})
        elif message.get("method") == "textDocument/publishDiagnostics":
            self.diagnostics[message["params"]["uri"]] = message["params"]["diagnostics"]
        return message

    def request(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        self._send({"id": self.next_id, "method": method, "params": params})
        while True:
            message = self._read()
            if message.get("id") == self.next_id and "method" not in message:
                assert "error" not in message, message
                return message.get("result")

    def notify(self, method: str, params: dict[str, Any]) -> None:
        self._send({"method": method, "params": params})

    def open(self, path: Path) -> str:
        uri = path.as_uri()
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "yaml", "version": 1,
                                                              "text": path.read_text()}})
        return uri

    def wait_for_diagnostics(self, uri: str, timeout: float = 20) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while uri not in self.diagnostics:
            assert time.monotonic() < deadline, "no diagnostics from the language server"
            self.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}})
        return self.diagnostics[uri]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def language_server() -> Any:
    if not YLS.exists():
        message = "yaml-language-server is not installed (dev/test.sh installs it with npm)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    server = LanguageServer(REPO)
    yield server
    server.close()


def position(path: Path, needle: str) -> dict[str, int]:
    lines = path.read_text().splitlines()
    row = next(i for i, line in enumerate(lines) if needle in line)
    return {"line": row, "character": lines[row].index(needle)}


def test_the_editor_completes_and_explains_verl_keys(language_server: LanguageServer) -> None:
    spec = REPO / "specs" / "qwen2-7b-gsm8k-ppo-mi300.yaml"
    uri = language_server.open(spec)
    where = position(spec, "ppo_mini_batch_size")
    hover = language_server.request("textDocument/hover", {
        "textDocument": {"uri": uri}, "position": {**where, "character": where["character"] + 3}})
    text = hover["contents"]["value"]
    assert "Split each sample into sub-batches of this size for PPO (verl 0.9.1; default 256)" in text, text
    completion = language_server.request("textDocument/completion", {"textDocument": {"uri": uri}, "position": where})
    labels = {item["label"] for item in (completion["items"] if isinstance(completion, dict) else completion)}
    assert {"clip_ratio", "use_kl_loss", "ppo_epochs", "entropy_coeff", "fsdp_config"} <= labels, labels
    assert "ppo_micro_batch_size_per_gpu" not in labels  # already set in this mapping
    assert language_server.wait_for_diagnostics(uri) == []


def test_the_editor_flags_a_mistyped_key_on_its_line(language_server: LanguageServer, tmp_path: Path) -> None:
    (tmp_path / "schema").mkdir()
    (tmp_path / "schema" / "verl-0.9.1.json").write_text((SCHEMAS / "verl-0.9.1.json").read_text())
    (tmp_path / "specs").mkdir()
    spec = tmp_path / "specs" / "typo.yaml"
    spec.write_text((REPO / "specs" / "qwen2-7b-gsm8k-ppo-mi300.yaml").read_text()
                    .replace("ppo_mini_batch_size: 256", "ppo_mini_batch_sise: 256"))
    found = language_server.wait_for_diagnostics(language_server.open(spec))
    where = position(spec, "ppo_mini_batch_sise")
    assert [(d["range"]["start"]["line"], d["message"]) for d in found] == [
        (where["line"], "Property ppo_mini_batch_sise is not allowed.")], found


def test_a_recipe_specs_schema_takes_the_recipes_own_keys(recipes: list[Path]) -> None:
    """#40 item 18: a spec running a recipe program got red marks on the recipe's own keys (DAPO's
    reward.reward_kwargs, SPPO's sppo_eta) from the release schema; `verlc schema --spec` composes the program's
    config at its commit, which takes them, and still refuses a mistyped key."""
    for spec in recipes:
        result = run_verlc("schema", "--spec", spec)
        assert result.returncode == 0, result.stderr
        assert f"$schema={spec.stem}.schema.json" in result.stderr
        validator = jsonschema.Draft202012Validator(json.loads(result.stdout))
        data = YAML(typ="safe", pure=True).load(spec.read_text())
        assert [e.message for e in validator.iter_errors(data)] == [], spec.name
        data["verl"]["trainer"]["total_epochz"] = 1
        assert any("total_epochz" in e.message for e in validator.iter_errors(data)), spec.name
    dapo = YAML(typ="safe", pure=True).load((REPO / "specs" / "recipes" / "dapo-qwen2.5-32b.yaml").read_text())
    assert any("reward_kwargs" in e for e in errors("0.9.1", dapo))  # what the release schema said
