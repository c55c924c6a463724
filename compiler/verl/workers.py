"""What verl's workers need when they start, read from one release's (or commit's) own code with `ast`.

The trainer's start-up path imports and loads things that no config check sees: an attention kernel that a
worker asks transformers for, a package a worker module imports at its top, a rollout class looked up in a
registry. A missing one kills the run about a minute after the workers start, on a real cluster after the
queue and the bring-up of every node. These facts let the preflight check them on every node first
(runtime/startup.py `startup_problems`) and the build refuse what the workers would refuse.

Read (`read`), stored in the release's schema under "startup", each fact with the verl file and line that
states it:
- imports: what each engine's worker module imports when it is loaded (its module-level imports and
  those of the verl modules they load, in turn), of the packages verl does not install itself (OPTIONAL);
  an import under `if is_cuda_available:` (or npu) holds on that device only, one in a `try` is optional;
- attention: where a worker asks transformers for `flash_attention_2` (the actor, critic and reward
  model workers of the FSDP engine, and the functions they call), and the `override_config` key that
  changes it when the code reads one (None: nothing in the config avoids it);
- flags: a package a worker imports only when a model flag is set (`if use_liger:`);
- rollouts: the rollout registry, (name/mode) -> the module of its class, where the release has one;
- loggers: the names trainer.logger may hold (Tracking.supported_backend, which Tracking asserts when the
  trainer starts logging, after the workers have started), and "tracking", which it takes with a warning;
- sglang_model_len: where the SGLang rollout asserts rollout.max_model_len >= prompt + response length (0.4);
  elsewhere a shorter max_model_len is taken, and the rollout engine cuts responses short;
- hf_repeats_n: where the HF rollout generates `rollout.n` sequences per prompt although the trainer has
  already repeated each prompt n times (the batch sizes then differ: verl 0.5.0).

Scope: the legacy FSDP/Megatron workers (`workers/fsdp_workers.py`, `workers/megatron_workers.py`, verl
0.3-0.7), and from 0.8 on, where those are gone, the engine workers (`workers/engine_workers.py`, each engine's
package under `workers/engine/`, what the TaskRunner that the trainer's main picks (0.9: by trainer.use_v1)
imports as it runs, and HFModelConfig's ask for an attention kernel). Not covered: 0.7.1's engine workers
(`use_legacy_worker_impl: disable`) beside its legacy ones, and the flags of the engine workers; `needs()` of a
config these do not cover is empty, and the preflight records that it could not know.
"""

from __future__ import annotations

import ast
import difflib
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .release import MISSING

# Packages verl's workers may import that verl's own requirements do not install.
# transfer_queue: verl 0.9's trainer imports it as it runs, and only verl's `verl-core` extra installs it.
OPTIONAL = ("apex", "flash_attn", "flashinfer", "liger_kernel", "mbridge", "megatron", "mindspeed", "sglang",
            "torch_npu", "transfer_queue", "transformer_engine", "trl", "vllm")
# Each engine's worker module (verl/trainer/main_ppo.py picks it by actor.strategy).
ENGINE_MODULES = {"fsdp": "verl.workers.fsdp_workers", "megatron": "verl.workers.megatron_workers"}
# 0.8 on, the legacy worker modules gone: one worker module for every engine, each engine's implementation a
# package of its own, started by the trainer's TaskRunner (whose `run` imports more as it begins).
ENGINE_WORKERS = "verl.workers.engine_workers"
# verl 0.9 on: the builders of each model family's chat turns, and where the agent loop makes one
CHAT_BUILDERS = "verl.utils.tokenizer.continuous_token"
CHAT_WIRING = "verl.utils.tokenizer.continuous_token_wiring"
AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
ENGINE_PACKAGES = {"fsdp": "verl.workers.engine.fsdp", "megatron": "verl.workers.engine.megatron"}
TRAINER = "verl.trainer.main_ppo"
# The model config the engine workers build each role's model from (HFModelConfig reads override_config).
MODEL_CONFIG = ("verl.workers.config.model", "HFModelConfig", ("actor_rollout_ref", "critic"))
# The worker classes of fsdp_workers.py, and the config section each one builds its model from.
ROLES = {"ActorRolloutRefWorker": "actor_rollout_ref", "CriticWorker": "critic", "RewardModelWorker": "reward_model"}
FA2 = "flash_attention_2"


def read(package: Path) -> dict[str, Any]:
    """The start-up facts of the verl package at `package` (the folder holding verl/__init__.py)."""
    code = _Code(package)
    legacy = {engine: list(code.imported(module)) for engine, module in ENGINE_MODULES.items() if code.file(module)}
    return {
        "imports": legacy or {engine: list(code.engine_imported(engine)) for engine in ENGINE_PACKAGES
                              if code.file(ENGINE_WORKERS) and code.file(ENGINE_PACKAGES[engine])},
        "attention": list(code.attention()),
        "flags": list(code.flags()),
        "rollouts": code.rollouts(),
        "hf_repeats_n": code.hf_repeats_n(),
        "expiry_save": code.expiry_save(),
        "loggers": code.loggers(),
        "sglang_model_len": code.sglang_model_len(),
        "engine_micro_batches": code.engine_micro_batches(),
        "chat_tokens": code.chat_tokens(),
    }


def read_rollouts(package: Path) -> dict[str, str]:
    """The rollout registry alone: `name/mode` -> the module of its class ({} where the release has none)."""
    return _Code(package).rollouts()


class _Code:
    """One verl package's modules, each parsed once."""

    def __init__(self, package: Path) -> None:
        self.package = package
        self._trees: dict[Path, ast.Module] = {}

    def file(self, module: str) -> Path | None:
        """The file of a `verl.` module (a package's __init__.py), or None."""
        parts = module.split(".")[1:]
        base = self.package.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def tree(self, path: Path) -> ast.Module:
        if path not in self._trees:
            with warnings.catch_warnings():  # verl's own invalid escapes, not ours to report
                warnings.simplefilter("ignore")
                self._trees[path] = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        return self._trees[path]

    def where(self, path: Path, line: int) -> str:
        return f"{path.relative_to(self.package.parent).as_posix()}:{line}"

    # --- imports when a module loads ----------------------------------------------------------------

    def imported(self, root: str) -> Iterator[dict[str, Any]]:
        """Each import of an OPTIONAL package that starting `root`'s workers runs, with its file:line, device
        and role: loading the module (role ""), and the imports at the top of each worker class's methods
        (verl imports its actor, critic and their kernels there, in `init_model`)."""
        path = self.file(root)
        assert path is not None
        seeds: list[tuple[str, str, str, ast.stmt, Path]] = []
        for cls in (n for n in self.tree(path).body if isinstance(n, ast.ClassDef) and n.name in ROLES):
            for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                for stmt, device in _loaded(method.body, ""):
                    seeds += [(name, device, ROLES[cls.name], stmt, path) for name in _names(stmt, root, False)]
        found: set[tuple[str, str, str, str]] = set()
        for name, device, role, stmt, where in [(root, "", "", None, path), *seeds]:  # type: ignore[list-item]
            facts = [(name, self.where(where, stmt.lineno), device)] if stmt is not None and _optional(name) else []
            facts += list(self._loading(name, device)) if name.split(".")[0] == "verl" else []
            for module, at, on in facts:
                if (module, at, on, role) not in found and (module, at, on, "") not in found:
                    found.add((module, at, on, role))
                    yield {"module": module, "where": at, "device": on, "role": role}

    def _loading(self, root: str, device: str) -> Iterator[tuple[str, str, str]]:
        """(module, file:line, device) of each OPTIONAL import that loading verl module `root` runs."""
        seen: set[str] = set()
        todo = [(root, device)]
        while todo:
            module, on = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            todo += [(p, on) for p in _parents(module)]
            path = self.file(module)
            if path is None:
                continue
            for stmt, here in _loaded(self.tree(path).body, on):
                for name in _names(stmt, module, path.name == "__init__.py"):
                    if name.split(".")[0] == "verl":
                        todo.append((name, here))
                    elif _optional(name):
                        yield name, self.where(path, stmt.lineno), here

    def engine_imported(self, engine: str) -> Iterator[dict[str, Any]]:
        """Each import of an OPTIONAL package that starting the engine workers runs (role ""): loading the worker
        module and the engine's package, and what the TaskRunner the trainer starts imports at the top of its
        `run`; a fact of a runner that a setting picks says which ("when": {"key", "value"})."""
        found: set[tuple[str, str, str, str]] = set()
        roots: list[tuple[str, str, dict | None]] = [(ENGINE_WORKERS, "", None), (ENGINE_PACKAGES[engine], "", None)]
        for module, run, when in self.runners():
            path = self.file(module)
            assert path is not None
            for stmt, device in _loaded(run.body, ""):
                for name in _names(stmt, module, False):
                    if name.split(".")[0] == "verl":
                        roots.append((name, device, when))
                    elif _optional(name) and (name, self.where(path, stmt.lineno), device, repr(when)) not in found:
                        found.add((name, self.where(path, stmt.lineno), device, repr(when)))
                        yield {"module": name, "where": self.where(path, stmt.lineno), "device": device, "role": "",
                               **({"when": when} if when else {})}
        for root, device, when in roots:
            for module, at, on in self._loading(root, device):
                if (module, at, on, repr(when)) not in found and (module, at, on, repr(None)) not in found:
                    found.add((module, at, on, repr(when)))
                    yield {"module": module, "where": at, "device": on, "role": "", **({"when": when} if when else {})}

    def runners(self) -> list[tuple[str, ast.FunctionDef, dict | None]]:
        """The `run` of each TaskRunner the trainer's `main` may start: (its module, the method, the setting that
        picks it as {"key", "value"}, or None). 0.9's main picks TaskRunnerV1 or main_ppo_v0's TaskRunner by
        `config.trainer.use_v1`; where main names no runner (0.8.0's run_ppo starts its own), every `run` of the
        trainer's classes, always."""
        trainer = self.file(TRAINER)
        if trainer is None:
            return []
        tree = self.tree(trainer)
        main = next((f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"), None)
        started = list(_runner_calls(main.body, None)) if main is not None else []
        if not started:
            return [(TRAINER, m, None) for c in tree.body if isinstance(c, ast.ClassDef)
                    for m in c.body if isinstance(m, ast.FunctionDef) and m.name == "run"]
        imported = {a.asname or a.name: _absolute(i, TRAINER, False) for i in ast.walk(main)
                    if isinstance(i, ast.ImportFrom) for a in i.names}
        out = []
        for name, when in started:
            module = imported.get(name, TRAINER)
            path = self.file(module)
            cls = next((c for c in self.tree(path).body if isinstance(c, ast.ClassDef) and c.name == name),
                       None) if path is not None else None
            run = next((m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "run"),
                       None) if cls is not None else None
            if run is not None:
                out.append((module, run, when))
        return out

    # --- attention kernels the workers ask for -----------------------------------------------------

    def attention(self) -> Iterator[dict[str, Any]]:
        path = self.file(ENGINE_MODULES["fsdp"])
        if path is None:
            yield from self._engine_attention()
            return
        tree = self.tree(path)
        functions = self._imported_functions(tree, ENGINE_MODULES["fsdp"])
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in ROLES):
            for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                for line, unless in _demands(method):
                    yield {"role": ROLES[cls.name], "where": self.where(path, line), "unless": unless}
                for call in (n for n in ast.walk(method) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
                    target = functions.get(call.func.id)
                    if target is None:
                        continue
                    fixed = sorted(line for line, unless in _demands(target[1]) if unless is None)
                    if fixed:  # a function the worker calls asks for it whatever the config says
                        yield {"role": ROLES[cls.name], "where": self.where(target[0], fixed[0]), "unless": None,
                               "via": self.where(path, call.lineno)}

    def _engine_attention(self) -> Iterator[dict[str, Any]]:
        """The engine workers' ask: the model config each role's model is built from (HFModelConfig)."""
        module, name, roles_ = MODEL_CONFIG
        path = self.file(module) if self.file(ENGINE_WORKERS) else None
        if path is None:
            return
        for cls in (n for n in self.tree(path).body if isinstance(n, ast.ClassDef) and n.name == name):
            for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                for line, unless in _demands(method):
                    for role in roles_:
                        yield {"role": role, "where": self.where(path, line), "unless": unless}

    def _imported_functions(self, tree: ast.Module, module: str) -> dict[str, tuple[Path, ast.FunctionDef]]:
        """Functions a module imports by name from other verl modules: name -> (file, definition)."""
        out: dict[str, tuple[Path, ast.FunctionDef]] = {}
        for stmt in ast.walk(tree):
            if not (isinstance(stmt, ast.ImportFrom) and _absolute(stmt, module, False).startswith("verl.")):
                continue
            path = self.file(_absolute(stmt, module, False))
            if path is None:
                continue
            defined = {n.name: n for n in self.tree(path).body if isinstance(n, ast.FunctionDef)}
            for alias in stmt.names:
                if alias.name in defined:
                    out[alias.asname or alias.name] = (path, defined[alias.name])
        return out

    # --- packages imported when a flag is set -------------------------------------------------------

    def flags(self) -> Iterator[dict[str, Any]]:
        path = self.file(ENGINE_MODULES["fsdp"])
        if path is None:
            return
        for cls in (n for n in self.tree(path).body if isinstance(n, ast.ClassDef) and n.name in ROLES):
            found: set[tuple[str, str]] = set()
            for branch in (n for n in ast.walk(cls) if isinstance(n, ast.If)):
                flag = _flag(branch.test)
                if flag is None:
                    continue
                for stmt in (s for b in branch.body for s in ast.walk(b) if isinstance(s, ast.ImportFrom)):
                    name = stmt.module or ""
                    if name.split(".")[0] in OPTIONAL and (flag, name) not in found:
                        found.add((flag, name))
                        yield {"role": ROLES[cls.name], "flag": flag, "module": name,
                               "where": self.where(path, stmt.lineno)}

    # --- the rollout registry -----------------------------------------------------------------------

    def rollouts(self) -> dict[str, str]:
        """`name/mode` -> the module of the registered class, where the release builds rollouts from it."""
        path = self.file("verl.workers.rollout.base")
        if path is None:
            return {}
        for node in ast.walk(self.tree(path)):
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_ROLLOUT_REGISTRY"
                                                     for t in node.targets) and isinstance(node.value, ast.Dict)):
                return {f"{k.elts[0].value}/{k.elts[1].value}": v.value.rsplit(".", 1)[0]
                        for k, v in zip(node.value.keys, node.value.values)
                        if isinstance(k, ast.Tuple) and len(k.elts) == 2
                        and all(isinstance(e, ast.Constant) for e in k.elts)
                        and isinstance(v, ast.Constant) and isinstance(v.value, str)}
        return {}

    # --- the HF rollout's n -------------------------------------------------------------------------

    def hf_repeats_n(self) -> list[str]:
        """[hf_rollout.py:line, ray_trainer.py:line] where both repeat each prompt rollout.n times, or []."""
        rollout = self.file("verl.workers.rollout.hf_rollout")
        trainer = self.file("verl.trainer.ppo.ray_trainer")
        if rollout is None or trainer is None:
            return []
        generates = next((k.lineno for d in ast.walk(self.tree(rollout)) if isinstance(d, ast.Dict)
                          for k, v in zip(d.keys, d.values)
                          if isinstance(k, ast.Constant) and k.value == "num_return_sequences"
                          and ast.unparse(v).endswith("config.n")), None)
        repeats = next((a.lineno for a in ast.walk(self.tree(trainer)) if isinstance(a, ast.Assign)
                        and [ast.unparse(t) for t in a.targets] == ["gen_batch"] and isinstance(a.value, ast.Call)
                        and ast.unparse(a.value.func) == "gen_batch.repeat"
                        and any(k.arg == "repeat_times" and ast.unparse(k.value).endswith("rollout.n")
                                for k in a.value.keywords)), None)
        if generates is None or repeats is None:
            return []
        return [self.where(rollout, generates), self.where(trainer, repeats)]


    # --- the save before the capacity's expiry -------------------------------------------------------

    def expiry_save(self) -> dict[str, Any] | None:
        """Where verl's trainer saves a checkpoint ahead of a capacity block's expiry (0.5.0 on): the environment
        variable should_save_ckpt_esi reads first (epoch seconds), where that function is defined, and where
        ray_trainer.py calls it; None where the release has no such save."""
        manager = self.file("verl.utils.checkpoint.checkpoint_manager")
        trainer = self.file("verl.trainer.ppo.ray_trainer")
        if manager is None or trainer is None:
            return None
        check = next((f for f in ast.walk(self.tree(manager))
                      if isinstance(f, ast.FunctionDef) and f.name == "should_save_ckpt_esi"), None)
        call = next((c for c in ast.walk(self.tree(trainer)) if isinstance(c, ast.Call)
                     and ast.unparse(c.func).split(".")[-1] == "should_save_ckpt_esi"), None)
        if check is None or call is None:
            return None
        variable = next((c.args[0].value for c in ast.walk(check) if isinstance(c, ast.Call)
                         and ast.unparse(c.func) in ("os.getenv", "os.environ.get") and c.args
                         and isinstance(c.args[0], ast.Constant)), None)
        if variable is None:
            return None
        return {"variable": variable, "check": self.where(manager, check.lineno),
                "called": self.where(trainer, call.lineno)}


    # --- the loggers the trainer's Tracking takes ---------------------------------------------------------

    def loggers(self) -> dict[str, Any] | None:
        """Tracking's supported_backend in verl/utils/tracking.py (the names trainer.logger may hold), with its
        file:line; None where the release has no such list."""
        path = self.file("verl.utils.tracking")
        if path is None:
            return None
        for node in ast.walk(self.tree(path)):
            if (isinstance(node, ast.Assign) and any(ast.unparse(t).split(".")[-1] == "supported_backend"
                                                     for t in node.targets)):
                try:
                    names = ast.literal_eval(node.value)
                except ValueError:
                    return None
                return {"names": list(names), "where": self.where(path, node.lineno)}
        return None


    def sglang_model_len(self) -> str | None:
        """Where the SGLang rollout asserts max_model_len >= prompt_length + response_length, or None."""
        path = self.file("verl.workers.rollout.sglang_rollout.sglang_rollout")
        if path is None:
            return None
        return next((self.where(path, n.lineno) for n in ast.walk(self.tree(path)) if isinstance(n, ast.Assert)
                     and re.fullmatch(r"self\.config\.max_model_len >= self\.config\.prompt_length \+ "
                                      r"self\.config\.response_length", ast.unparse(n.test))), None)

    def engine_micro_batches(self) -> dict[str, Any] | None:
        """Where the engine workers' prepare_micro_batches asserts that a rank's batch divides by the micro batch
        (when dynamic batch size is off), and whether the release has the legacy FSDP workers beside them (then
        the engine workers run only with trainer.use_legacy_worker_impl: disable); None where it has no such
        assert."""
        path = self.file("verl.workers.engine.utils")
        if path is None:
            return None
        where = next((self.where(path, n.lineno) for n in ast.walk(self.tree(path)) if isinstance(n, ast.Assert)
                      and re.fullmatch(r"total_data_size % \(force_group_size \* micro_batch_size_per_gpu\) == 0",
                                       ast.unparse(n.test))), None)
        return None if where is None else {"where": where,
                                           "legacy": self.file(ENGINE_MODULES["fsdp"]) is not None}


    def chat_tokens(self) -> dict[str, Any] | None:
        """What verl's agent loop requires of a text model's tokenizer, by its config.json model_type (verl 0.9
        on: every rollout builds its turns with the builder of the model's family, whose __init__ raises at the
        first rollout where the tokenizer falls short): {"call": where the agent loop builds it, "model_types":
        {model_type: [[text, where it is required, kind], ...]}}, kind "token" (`require_token_id`: the token is
        the tokenizer's) or "one id" (`tokenizer.encode(text)` must give one id); None where the release has no
        such builders. Read from a builder's __init__ (its own and its bases'), each text a literal or a class
        attribute's literal; the vision-language builders (they need the model's processor too) are left
        out."""
        wiring, builders = self.file(CHAT_WIRING), self.file(CHAT_BUILDERS)
        loop = self.file(AGENT_LOOP)
        if wiring is None or builders is None or loop is None:
            return None
        call = next((n for n in ast.walk(self.tree(loop)) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Name) and n.func.id == "create_continuous_token_builder"), None)
        tables = {}
        for node in self.tree(wiring).body:
            target = node.target if isinstance(node, ast.AnnAssign) else \
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
                tables[target.id] = node.value
        families, registry = tables.get("_MODEL_TYPE_TO_FAMILY"), tables.get("_CONTINUOUS_TOKEN_BUILDER_REGISTRY")
        if call is None or families is None or registry is None:
            return None
        family_of = {k.value: v.attr for k, v in zip(families.keys, families.values)
                     if isinstance(k, ast.Constant) and isinstance(v, ast.Attribute)}
        builder_of = {k.attr: v.id for k, v in zip(registry.keys, registry.values)
                      if isinstance(k, ast.Attribute) and isinstance(v, ast.Name)}
        classes = {c.name: c for c in self.tree(builders).body if isinstance(c, ast.ClassDef)}

        def lineage(name: str) -> list[ast.ClassDef]:
            cls = classes.get(name)
            if cls is None:
                return []
            return [cls] + [c for base in cls.bases if isinstance(base, ast.Name) for c in lineage(base.id)]

        def required(name: str) -> list[list[str]]:
            chain = lineage(name)
            constants = {t.id: stmt.value.value for cls in reversed(chain) for stmt in cls.body
                         if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                         and isinstance(stmt.value.value, str) for t in stmt.targets if isinstance(t, ast.Name)}
            out: list[list[str]] = []
            for cls in chain:
                init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
                for n in ast.walk(init) if init else ():
                    if not isinstance(n, ast.Call) or not n.args:
                        continue
                    if isinstance(n.func, ast.Name) and n.func.id == "require_token_id" and len(n.args) == 2:
                        arg, kind = n.args[1], "token"
                    elif isinstance(n.func, ast.Attribute) and n.func.attr == "encode" and \
                            isinstance(n.func.value, ast.Name) and n.func.value.id == "tokenizer":
                        arg, kind = n.args[0], "one id"  # the builder raises unless it encodes to one id
                    else:
                        continue
                    text = arg.value if isinstance(arg, ast.Constant) else constants.get(arg.attr) \
                        if isinstance(arg, ast.Attribute) else None
                    if isinstance(text, str) and [text, kind] not in [[t, k] for t, _, k in out]:
                        out.append([text, self.where(builders, n.lineno), kind])
            return out

        model_types = {}
        for model_type, family in sorted(family_of.items()):
            builder = builder_of.get(family, "")
            if any("VL" in c.name for c in lineage(builder)):
                continue
            tokens = required(builder)
            if tokens:
                model_types[model_type] = tokens
        return {"call": self.where(loop, call.lineno), "model_types": model_types}


def _parents(module: str) -> list[str]:
    """The packages Python runs first when it imports `module` (verl.a.b: verl, verl.a)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _optional(module: str) -> bool:
    return module.split(".")[0] in OPTIONAL


def _device(test: ast.expr) -> str | None:
    """'cuda' / 'npu' for a test of the device (`is_cuda_available`, `get_device_name() == "npu"`), else None."""
    text = ast.unparse(test)
    if "not " in text:
        return None
    return "cuda" if "cuda" in text else "npu" if "npu" in text else None


def _loaded(body: list[ast.stmt], device: str) -> Iterator[tuple[ast.stmt, str]]:
    """The import statements a body runs on every start-up path: at its top, and under a test of the device
    (`if is_cuda_available: ... elif is_npu_available: ...`), with that device ("" for any)."""
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            yield stmt, device
        elif isinstance(stmt, ast.If):
            chosen = _device(stmt.test)
            if chosen is None or device not in ("", chosen):
                continue  # any other condition (TYPE_CHECKING, a version test): not on every start-up path
            yield from _loaded(stmt.body, chosen)
            if len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If) and not device:
                yield from _loaded(stmt.orelse, "")  # an elif testing another device


def _runner_calls(body: list[ast.stmt], when: dict | None) -> Iterator[tuple[str, dict | None]]:
    """(runner class name, the setting that picks it) of each `run_ppo(..., task_runner_class=NAME)` in `body`,
    where an `if config.KEY:` around it picks it (value true in its body, false in its else)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            key = _config_key(stmt.test)
            yield from _runner_calls(stmt.body, {"key": key, "value": True} if key else when)
            yield from _runner_calls(stmt.orelse, {"key": key, "value": False} if key else when)
            continue
        for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                     and n.func.id == "run_ppo"):
            for keyword in call.keywords:
                if keyword.arg == "task_runner_class" and isinstance(keyword.value, ast.Name):
                    yield keyword.value.id, when


def _config_key(test: ast.expr) -> str | None:
    """"trainer.use_v1" of a test `config.trainer.use_v1`, else None."""
    parts = []
    while isinstance(test, ast.Attribute):
        parts.append(test.attr)
        test = test.value
    return ".".join(reversed(parts)) if isinstance(test, ast.Name) and test.id == "config" and parts else None


def _absolute(stmt: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not stmt.level:
        return stmt.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (stmt.level - 1)]
    return ".".join([*base, stmt.module] if stmt.module else base)


def _names(stmt: ast.stmt, module: str, is_package: bool) -> list[str]:
    """The modules an import statement loads (`from a import b` loads a, and a.b when b is a module)."""
    if isinstance(stmt, ast.Import):
        return [alias.name for alias in stmt.names]
    assert isinstance(stmt, ast.ImportFrom)
    source = _absolute(stmt, module, is_package)
    if source.split(".")[0] == "verl":
        return [source, *(f"{source}.{a.name}" for a in stmt.names if a.name != "*")]
    return [source]


def _demands(function: ast.FunctionDef) -> Iterator[tuple[int, str | None]]:
    """(line, the override_config key that changes it or None) for each ask for flash_attention_2.

    `attn_implementation="flash_attention_2"` on a model's from_pretrained: fixed. On `AutoConfig.from_pretrained`
    whose config the function later passes to `update_model_config` (verl's override_config): transformers'
    `_attn_implementation` setter there changes it. `x.get("attn_implementation", "flash_attention_2")`: verl reads
    override_config's `attn_implementation`."""
    updated = {ast.unparse(c.args[0]): c.lineno for c in ast.walk(function)
               if isinstance(c, ast.Call) and ast.unparse(c.func).endswith("update_model_config") and c.args}
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and _reads_override(node):
            yield node.lineno, "attn_implementation"
        if not (isinstance(node, ast.Assign | ast.Expr | ast.Return) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        for keyword in call.keywords:
            if not (keyword.arg == "attn_implementation" and isinstance(keyword.value, ast.Constant)
                    and keyword.value.value == FA2):
                continue
            target = ast.unparse(node.targets[0]) if isinstance(node, ast.Assign) and len(node.targets) == 1 else ""
            is_config = ast.unparse(call.func).endswith("AutoConfig.from_pretrained")
            later = updated.get(target, 0) > node.lineno
            yield keyword.value.lineno, "_attn_implementation" if is_config and later else None


def _reads_override(call: ast.Call) -> bool:
    """`something.get("attn_implementation", "flash_attention_2")`."""
    return (isinstance(call.func, ast.Attribute) and call.func.attr == "get" and len(call.args) == 2
            and all(isinstance(a, ast.Constant) for a in call.args)
            and [a.value for a in call.args] == ["attn_implementation", FA2])  # type: ignore[attr-defined]


def _flag(test: ast.expr) -> str | None:
    """The model flag a test reads (`use_liger`, `self.config.model.get("use_liger", False)`), or None."""
    for node in ast.walk(test):
        if isinstance(node, ast.Name) and node.id.startswith("use_"):
            return node.id
        if isinstance(node, ast.Attribute) and node.attr.startswith("use_"):
            return node.attr
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("use_"):
            return node.value
    return None


# --- what one config needs, from those facts -----------------------------------------------------------

ROLE_WORDS = {"": "", "actor_rollout_ref": "actor", "critic": "critic", "reward_model": "reward model"}


@dataclass(frozen=True)
class Need:
    """One thing every node must have for the trainer's start-up path (the runtime's preflight checks it: runtime/startup.py)."""

    check: str   # "import": the module imports; "flash_attention_2": transformers can use flash-attn 2;
    #              "chat_tokens": the model's tokenizer defines the tokens its family's builder requires
    module: str  # what is imported (flash_attention_2: the flash_attn package; chat_tokens: the builders' module)
    device: str  # "cuda" or "npu": checked only where the node's torch sees that device; "" everywhere
    where: str   # the verl file and line that needs it (and where it is called from)
    why: str     # who needs it, in words
    avoid: str   # how a spec avoids it, or ""
    # chat_tokens: each config.json model_type whose chat builder requires something of the tokenizer -> the verl
    # files and lines that require it (the node runs verl's builder itself: the requirements are its own)
    model_types: dict[str, list[str]] = field(default_factory=dict)


def engine_of(get: Any) -> str:
    """The worker engine main_ppo picks by actor.strategy (fsdp and fsdp2 share fsdp_workers.py)."""
    return "megatron" if get("actor_rollout_ref.actor.strategy") == "megatron" else "fsdp"


def roles(get: Any, use_critic: bool) -> dict[str, bool]:
    """Which worker roles the trainer starts ("" is the module every role loads)."""
    return {"": True, "actor_rollout_ref": True, "critic": use_critic,
            "reward_model": bool(get("reward_model.enable"))}


def known(startup: dict[str, Any], get: Any) -> bool:
    """Whether the release's facts cover the workers this config starts (not 0.8 on's engine workers)."""
    return engine_of(get) in startup.get("imports", {})


def needs(startup: dict[str, Any], get: Any, *, use_critic: bool, accelerator: str, label: str) -> tuple[Need, ...]:
    """What the workers this config starts need on every node, in a stable order (one need per package and
    role, at the first place verl states it)."""
    if not known(startup, get):
        return ()
    device = "npu" if accelerator == "npu" else "cuda"  # ROCm's torch answers torch.cuda too
    active = roles(get, use_critic)
    engine = engine_of(get)
    out: dict[tuple[str, str, str], Need] = {}

    def add(key: tuple[str, str, str], need: Need) -> None:
        out.setdefault(key, need)

    for fact in startup["imports"][engine]:
        when = fact.get("when")
        if when and get(when["key"]) not in (when["value"], None):
            continue  # a runner this config does not start
        if active.get(fact["role"]) and fact["device"] in ("", device):
            who = (f"the {ROLE_WORDS[fact['role']]} worker" if fact["role"] else "the trainer"
                   if fact["where"].startswith("verl/trainer/") else f"the {engine} worker module")
            on = f" on {fact['device'].upper()}" if fact["device"] else ""
            picked = f" ({when['key']}: {str(when['value']).lower()})" if when else ""
            add(("import", fact["module"].split(".")[0], ""), Need(  # one need per package: its first place
                "import", fact["module"], fact["device"], fact["where"],
                f"{label}: {who} imports it when it starts{on}{picked}", ""))
    if engine == "fsdp" and device == "cuda":
        for role, on in active.items():
            facts = [f for f in startup.get("attention", []) if f["role"] == role and on]
            fixed = [f for f in facts if f["unless"] is None]
            if fixed:
                f = next((g for g in fixed if "via" in g), fixed[0])  # the model load, where a call leads to it
                called = f" (called from {f['via']})" if "via" in f else ""
                add(("attention", "flash_attn", role), Need(
                    FA2, "flash_attn", "cuda", f["where"] + called,
                    f"{label}: the {ROLE_WORDS[role]} loads its model with {FA2}, whatever the config says", ""))
                continue
            for f in facts:
                key = f"{role}.model.override_config.{f['unless']}"
                if get(key) in (None, FA2):
                    add(("attention", "flash_attn", role), Need(
                        FA2, "flash_attn", "cuda", f["where"],
                        f"{label}: the {ROLE_WORDS[role]} asks transformers for {FA2} unless {key} says otherwise",
                        f"set {key}: sdpa to load the model without flash-attn"))
    for fact in startup.get("flags", []):
        key = f"{fact['role']}.model.{fact['flag']}"
        if active.get(fact["role"]) and get(key) is True:
            add(("flag", fact["module"].split(".")[0], fact["role"]), Need(
                "import", fact["module"], "", fact["where"],
                f"{label}: the {ROLE_WORDS[fact['role']]} imports it with {key}: true", f"set {key}: false"))
    registered = startup.get("rollouts", {}).get(f"{get('actor_rollout_ref.rollout.name')}/"
                                                  f"{get('actor_rollout_ref.rollout.mode')}")
    if registered:
        add(("rollout", registered, ""), Need(
            "import", registered, device, "verl/workers/rollout/base.py (_ROLLOUT_REGISTRY)",
            f"{label}: the workers build the rollout ({get('actor_rollout_ref.rollout.name')}, "
            f"{get('actor_rollout_ref.rollout.mode')}) from this module", ""))
    chat = startup.get("chat_tokens")
    if chat and chat["model_types"]:
        add(("chat_tokens", "", ""), Need(
            "chat_tokens", CHAT_WIRING, "", chat["call"],
            f"{label}: the agent loop builds every rollout's turns around the special tokens of the model's family "
            f"(by its config.json model_type) and fails at the first rollout without them", "",
            {model_type: sorted({where for _, where, _ in required}) for model_type, required in
             chat["model_types"].items()}))
    return tuple(out.values())


@dataclass(frozen=True)
class External:
    """The modules a run's VERL_USE_EXTERNAL_MODULES names (verl imports them as it loads, in every release with
    a rollout registry): the rollouts those read from the run's code register ("name/mode"), and the modules
    verlc could not read there (installed in the image, say)."""

    modules: tuple[str, ...] = ()
    rollouts: frozenset[str] = frozenset()
    unread: tuple[str, ...] = ()


# A registration in a module's source: a (name, mode) pair in a file that names verl's registry.
_REGISTERED = re.compile(r"""\(\s*["']([\w.-]+)["']\s*,\s*["']([\w.-]+)["']\s*\)""")


def external_modules(names: str, code: Path | None) -> External:
    """What VERL_USE_EXTERNAL_MODULES (comma-separated module names) registers, read from the run's `code`."""
    modules = tuple(m.strip() for m in names.split(",") if m.strip())
    rollouts: set[str] = set()
    unread = []
    for module in modules:
        base = (code / module.replace(".", "/")) if code is not None else None
        source = next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None) \
            if base is not None else None
        if source is None:
            unread.append(module)
            continue
        text = source.read_text(errors="replace")
        if "_ROLLOUT_REGISTRY" in text:
            rollouts.update(f"{n}/{m}" for n, m in _REGISTERED.findall(text))
    return External(modules, frozenset(rollouts), tuple(unread))


def with_external(release: Any, external: External) -> Any:
    """`release` as a run whose VERL_USE_EXTERNAL_MODULES names `external` sees it: the rollouts those modules
    register are in its registry (and so among the names and modes it takes); where a module could not be read,
    verlc cannot know what it registers, and the registry's refusal becomes a note."""
    from dataclasses import replace

    names = "actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.mode"
    allowed = dict(release.allowed)
    startup = dict(release.startup)
    if "rollouts" in startup:
        startup["rollouts"] = {**startup["rollouts"], **{r: None for r in external.rollouts}}
        startup["external_unread"] = list(external.unread)
    for i, key in enumerate(names):
        if key in allowed:
            allowed[key] = () if external.unread else tuple(sorted(
                {*allowed[key], *(r.split("/")[i] for r in external.rollouts)}))
    return replace(release, allowed={k: v for k, v in allowed.items() if v}, startup=startup)


def startup_rules(startup: dict[str, Any], get: Any, *, use_critic: bool, label: str
                  ) -> Iterator[tuple[tuple[str, ...], str, bool]]:
    """What the workers will refuse at start-up, or a note of what they will need: (keys involved, message,
    whether it is a refusal)."""
    name, mode = get("actor_rollout_ref.rollout.name"), get("actor_rollout_ref.rollout.mode")
    registry = startup.get("rollouts", {})
    if registry and isinstance(name, str) and MISSING not in (name, mode) and f"{name}/{mode}" not in registry:
        pairs = ", ".join(f"({p.replace('/', ', ')})" for p in registry)
        said = (f"{label} builds its rollout from a registry of (name, mode) {pairs}; ({name}, {mode}) is not in it "
                f"(verl/workers/rollout/base.py get_rollout_class)")
        unread = startup.get("external_unread")
        if unread:
            yield (("actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.mode"),
                   f"{said}, unless VERL_USE_EXTERNAL_MODULES' {', '.join(unread)} (imported as verl loads; not in "
                   f"the run's code, where verlc reads such a module) registers it: verlc cannot know", False)
        else:
            yield (("actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.mode"), said + (
                ", nor do the modules of VERL_USE_EXTERNAL_MODULES register it" if "external_unread" in startup
                else ""), True)
    loggers, logger = startup.get("loggers"), get("trainer.logger")
    named = [logger] if isinstance(logger, str) else logger if isinstance(logger, list) else []
    if loggers and MISSING not in named:
        for unknown in (n for n in named if isinstance(n, str) and n not in (*loggers["names"], "tracking")):
            near = difflib.get_close_matches(unknown, loggers["names"], n=1)
            yield (("trainer.logger",),
                   f"{label}'s trainer logs to {', '.join(loggers['names'])}; {unknown!r} is not one of them"
                   + (f" (did you mean {near[0]!r}?)" if near else "")
                   + f": its Tracking asserts it ({loggers['where']})", True)
    limit, prompt, response = (get(k) for k in ("actor_rollout_ref.rollout.max_model_len", "data.max_prompt_length",
                                                "data.max_response_length"))
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (limit, prompt, response)) \
            and prompt + response > limit:
        asserted = startup.get("sglang_model_len") if name == "sglang" else None
        said = (f"rollout.max_model_len ({limit}) is below data.max_prompt_length + data.max_response_length "
                f"({prompt} + {response} = {prompt + response})")
        yield (("actor_rollout_ref.rollout.max_model_len", "data.max_prompt_length", "data.max_response_length"),
               f"{said}: {label}'s SGLang rollout asserts it ({asserted})" if asserted else
               f"{said}: {label} takes it, and the rollout engine cuts a response short once prompt and response "
               f"reach {limit} tokens", bool(asserted))
    n = get("actor_rollout_ref.rollout.n")
    repeats = startup.get("hf_repeats_n", [])
    if name == "hf" and repeats and isinstance(n, int) and n > 1:
        yield (("actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.name"),
               f"{label}'s HF rollout generates rollout.n ({n}) sequences per prompt ({repeats[0]}) of a batch the "
               f"trainer has already repeated n times ({repeats[1]}): the batch sizes then differ and the first "
               f"step fails; use rollout.n: 1 with hf, or the vllm or sglang rollout", True)
    if known(startup, get) and engine_of(get) == "fsdp" and use_critic:
        fixed = [f for f in startup.get("attention", []) if f["role"] == "critic" and f["unless"] is None]
        if fixed:
            where = next((g for g in fixed if "via" in g), fixed[0])["where"]
            yield (("algorithm.adv_estimator",),
                   f"{label}'s critic loads its model with {FA2} whatever the config says ({where}): "
                   f"every node needs flash-attn installed for this torch (the preflight checks it)", False)
    yield from _engine_micro_batches(startup.get("engine_micro_batches"), get, label)


def _engine_micro_batches(fact: dict[str, Any] | None, get: Any, label: str
                          ) -> Iterator[tuple[tuple[str, ...], str, bool]]:
    """The engine workers' compute_log_prob (and the reference's) hands each data-parallel rank train_batch_size x
    rollout.n / (GPUs / sequence parallel) samples, which prepare_micro_batches asserts divide by the micro batch
    unless dynamic batch size is on (verl/workers/engine/utils.py)."""
    if fact is None or (fact["legacy"] and get("trainer.use_legacy_worker_impl") != "disable"):
        return
    train, n, nnodes, per_node = (get(k) for k in ("data.train_batch_size", "actor_rollout_ref.rollout.n",
                                                   "trainer.nnodes", "trainer.n_gpus_per_node"))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (train, n, nnodes, per_node)):
        return
    uses_ref = bool(get("actor_rollout_ref.actor.use_kl_loss")) or bool(get("algorithm.use_kl_in_reward"))
    roles = [("actor_rollout_ref.rollout", "actor_rollout_ref.actor", "compute_log_prob")]
    if uses_ref:
        roles.append(("actor_rollout_ref.ref", "actor_rollout_ref.ref", "compute_ref_log_prob"))
    for section, sp_section, call in roles:
        micro = get(f"{section}.log_prob_micro_batch_size_per_gpu")
        dynamic = get(f"{section}.log_prob_use_dynamic_bsz")
        sp = get(f"{sp_section}.ulysses_sequence_parallel_size") or 1
        if dynamic or not isinstance(micro, int) or isinstance(micro, bool) or micro <= 0 or not isinstance(sp, int):
            continue
        gpus = nnodes * per_node
        if gpus % sp or (train * n) % (gpus // sp):
            continue  # another rule says why the batch does not split over the ranks
        rank = train * n // (gpus // sp)
        if rank % micro:
            yield ((f"{section}.log_prob_micro_batch_size_per_gpu", "data.train_batch_size",
                    "actor_rollout_ref.rollout.n"),
                   f"{label}'s engine workers hand each data-parallel rank of {call} data.train_batch_size x "
                   f"rollout.n / (GPUs / sequence parallel) = {train} x {n} / ({gpus} / {sp}) = {rank} samples, "
                   f"which {section}.log_prob_micro_batch_size_per_gpu ({micro}) does not divide: its "
                   f"prepare_micro_batches asserts it ({fact['where']}); pick a divisor of {rank}, or "
                   f"log_prob_use_dynamic_bsz", True)
