"""#55 services beside the trainer, on this machine without Ray: the runtime's head services (runtime/services.py)
with the real test servers (tests/services/): ready, probed, a service never ready, a service killed while the
trainer runs (started again, then the run fails naming it), and nothing left running. On Ray and with the
bundles: tests/test_ray_job.py; bad specs: tests/invalid/services-*.yaml."""

from __future__ import annotations

import os
import shutil
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from verlc.compiler.verl.hydra import SERVICE_ATTRIBUTES
from verlc.runtime.job import Probe, Service
from verlc.runtime.protocol import SERVICE_PORTS
from verlc.runtime.addresses import own_nodes, service_ports
from verlc.runtime.services import Services

SERVERS = Path(__file__).parent / "services"


def sandbox(restart: int = 0, deadline: int = 60, argv: list | None = None, **probe: str) -> Service:
    port = [{"env": "VERLC_SERVICE_SANDBOX_PORT"}]
    return Service(name="sandbox", argv=argv or [[sys.executable], [str(SERVERS / "sandbox.py")], ["--host"],
                                                 [{"env": "VERLC_SERVICE_SANDBOX_HOST"}], ["--port"], port],
                   env={}, image=None, every_node=False, own_node=False, gpus=0, listen_all=False,
                   ready_http="/health", ready_command=None,
                   deadline=deadline, probe=Probe(kind="sandbox", **probe), restart=restart,
                   variables={a: f"VERLC_SERVICE_SANDBOX_{a.upper()}" for a in SERVICE_ATTRIBUTES})


@pytest.fixture
def services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    made: list[Services] = []

    def make(*specs: Service) -> Services:
        made.append(Services(list(specs), str(tmp_path)))
        return made[-1]

    for key in [k for k in os.environ if k.startswith("VERLC_SERVICE_")]:
        monkeypatch.delenv(key)
    yield make
    for s in made:
        s.stop()
    for key in [k for k in os.environ if k.startswith("VERLC_SERVICE_")]:  # start_head sets them
        del os.environ[key]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_head_service_is_ready_probed_recorded_and_stopped(services, capsys) -> None:  # noqa: ANN001
    running = services(sandbox())
    running.start_head("127.0.0.1")
    assert os.environ["VERLC_SERVICE_SANDBOX_URL"] == f"http://127.0.0.1:{os.environ['VERLC_SERVICE_SANDBOX_PORT']}"
    assert running.ready() == []
    assert running.record["sandbox"]["probe_passed"] and running.record["sandbox"]["probe"] == "sandbox"
    pid = running.head["sandbox"].proc.pid
    running.stop()
    assert not pid_alive(pid)
    out = capsys.readouterr().out
    assert "service sandbox: ready in" in out and "sandbox probe passed" in out and "services stopped: sandbox" in out


def test_a_services_token_is_made_per_run_handed_to_both_sides_and_kept_out_of_verlcs_output(services, capsys
                                                                                           ) -> None:  # noqa: ANN001
    """The sandbox runs code only for its token: the probe carries it (and passes), a request without it is
    refused, two starts make two tokens, and nothing verlc printed or recorded holds it."""
    import json
    import urllib.error
    import urllib.request

    guarded = sandbox(argv=[[sys.executable], [str(SERVERS / "sandbox.py")], ["--host"],
                            [{"env": "VERLC_SERVICE_SANDBOX_HOST"}], ["--port"], [{"env": "VERLC_SERVICE_SANDBOX_PORT"}],
                            ["--token-env"], ["VERLC_SERVICE_SANDBOX_TOKEN"]])
    running = services(guarded)
    running.start_head("127.0.0.1")
    token = os.environ["VERLC_SERVICE_SANDBOX_TOKEN"]
    assert len(token) >= 32
    assert running.ready() == [] and running.record["sandbox"]["probe_passed"]
    request = urllib.request.Request(os.environ["VERLC_SERVICE_SANDBOX_URL"] + "/run_code",
                                     data=json.dumps({"code": "print(1)", "language": "python"}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    running.stop()
    again = services(guarded)
    again.start_head("127.0.0.1")
    assert os.environ["VERLC_SERVICE_SANDBOX_TOKEN"] != token
    again.stop()
    assert token not in capsys.readouterr().out + json.dumps(running.record)


def test_a_service_listening_on_every_interface_fails_at_once_unless_the_spec_says_so(services) -> None:  # noqa: ANN001
    """listen: private (the default) is enforced: a server bound to 0.0.0.0 fails the preflight as soon as it is
    ready, naming what to do; with listen: all the same server passes."""
    argv = [[sys.executable], [str(SERVERS / "sandbox.py")], ["--host"], ["0.0.0.0"], ["--port"],
            [{"env": "VERLC_SERVICE_SANDBOX_PORT"}]]
    running = services(sandbox(argv=argv))
    running.start_head("127.0.0.1")
    began = time.monotonic()
    problems = running.ready()
    assert time.monotonic() - began < 15
    port = os.environ["VERLC_SERVICE_SANDBOX_PORT"]
    assert len(problems) == 1 and problems[0].startswith(
        f"service sandbox listens on every interface of its node (port {port})"), problems
    assert "bind it to ${services.sandbox.host}, or set services.sandbox.listen: all" in problems[0]
    running.stop()
    from dataclasses import replace

    opened = services(replace(sandbox(argv=argv), listen_all=True))
    opened.start_head("127.0.0.1")
    assert opened.ready() == []


def test_a_service_never_ready_fails_by_its_deadline_naming_it_with_its_last_lines(services) -> None:  # noqa: ANN001
    # listens on another port than the one verlc gave it: never ready there, and the failure names the port it
    # does listen on, read from the kernel's tables for the service's own processes (#64 item 4)
    elsewhere = service_ports(1)[0]
    silent = sandbox(deadline=3, argv=[[sys.executable], [str(SERVERS / "sandbox.py")], ["--host"], ["127.0.0.1"],
                                       ["--port"], [str(elsewhere)]])
    running = services(silent)
    running.start_head("127.0.0.1")
    began = time.monotonic()
    problems = running.ready()
    assert time.monotonic() - began < 15
    assert len(problems) == 1 and problems[0].startswith("service sandbox was not ready within 3s (ready.deadline): "
                                                         "GET /health answered"), problems
    assert "its log: " in problems[0]
    assert f"its process listens on port {elsewhere} instead of " in problems[0], problems


def test_a_service_whose_command_is_not_in_the_image_fails_the_preflight_naming_it(services, capsys) -> None:  # noqa: ANN001
    """The job's image lacks the service's program (an example's uvicorn in a plain image): the job goes on to the
    preflight, which names the service and why (not a traceback of the runtime's)."""
    running = services(sandbox(argv=[["no-such-server-verlc"], ["--port"], ["1"]]))
    running.start_head("127.0.0.1")
    problems = running.ready()
    assert len(problems) == 1 and problems[0].startswith("service sandbox exited with code 127"), problems
    shown = capsys.readouterr().out  # its last lines, above the problem
    assert "[service sandbox] verlc: cannot start 'no-such-server-verlc' here: No such file or directory" in shown
    running.stop()


def test_a_service_killed_while_training_is_started_again_then_fails_the_run(services, capsys) -> None:  # noqa: ANN001
    running = services(sandbox(restart=1))
    running.start_head("127.0.0.1")
    assert running.ready() == []
    os.kill(running.head["sandbox"].proc.pid, signal.SIGKILL)
    running.head["sandbox"].proc.wait()
    assert running.failed() is None  # started again (1 of 1)
    assert "starting it again (1 of 1)" in capsys.readouterr().out
    assert running.ready() == []  # back, at the same address
    os.kill(running.head["sandbox"].proc.pid, signal.SIGKILL)
    running.head["sandbox"].proc.wait()
    failed = running.failed()
    assert failed and failed.startswith("service sandbox exited with code -9"), failed


def test_a_service_in_an_image_of_its_own_is_the_targets_checked_and_watched_here_never_started_or_stopped(
        services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # noqa: ANN001
    """The target started the container (here: the test starts the sandbox, as the target would) and gave the
    runtime the service's variables: the runtime takes them as they are (no token of its own), waits for it,
    probes it with the target's token, records it; it stops nothing of it; once the service stops accepting
    connections while training, the run fails naming it, its address and where its log is. Where the target
    gave no variables, the preflight says which are missing."""
    import secrets

    port, token = service_ports(1)[0], secrets.token_urlsafe(24)
    monkeypatch.setenv(SERVICE_PORTS, f"{port}-{port}")  # the job's block: its first is the sandbox's
    given = {"VERLC_SERVICE_SANDBOX_HOST": "127.0.0.1", "VERLC_SERVICE_SANDBOX_PORT": str(port),
             "VERLC_SERVICE_SANDBOX_URL": f"http://127.0.0.1:{port}", "VERLC_SERVICE_SANDBOX_TOKEN": token}
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    container = subprocess.Popen([sys.executable, str(SERVERS / "sandbox.py"), "--host", "127.0.0.1", "--port",
                                  str(port), "--token-env", "VERLC_SERVICE_SANDBOX_TOKEN"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        running = services(replace(sandbox(argv=[]), image="localhost/sandbox:1"))
        running.start_head("127.0.0.1")
        assert {k: os.environ[k] for k in given} == given and running.head == {}
        assert running.ready() == [] and running.record["sandbox"]["probe_passed"]
        assert running.failed() is None
        running.stop()
        assert container.poll() is None  # the target's to stop
        container.terminate()
        container.wait()
        failed = running.failed()
        assert failed and failed.startswith(f"service sandbox stopped accepting connections at 127.0.0.1:{port} "), \
            failed
        assert "its log: its container's output, which the target keeps: verlc logs RUN --service sandbox" in failed
    finally:
        container.kill()
        container.wait()
    out = capsys.readouterr().out
    assert "service sandbox: in its own image localhost/sandbox:1, started by the target on the head node at " \
           f"http://127.0.0.1:{port}" in out and token not in out
    monkeypatch.delenv("VERLC_SERVICE_SANDBOX_TOKEN")
    missing = services(replace(sandbox(argv=[]), image="localhost/sandbox:1"))
    missing.start_head("127.0.0.1")
    assert missing.ready() == ["service sandbox: its image localhost/sandbox:1 is the target's to start, and the "
                               "target gave the job no VERLC_SERVICE_SANDBOX_TOKEN"]


def test_the_ports_come_from_the_jobs_block_where_the_target_gives_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SERVICE_PORTS, "20300-20309")
    assert service_ports(3) == [20300, 20301, 20302]
    with pytest.raises(ValueError, match="holds 10 ports for 11 services"):
        service_ports(11)
    monkeypatch.delenv(SERVICE_PORTS)
    free = service_ports(3)
    assert len(set(free)) == 3


def test_a_token_in_verls_settings_is_noted_where_it_is_written(tmp_path: Path) -> None:
    """verl prints its resolved config as it starts: a token in a verl value would be in the job's log, which the
    build says at that value's line (and builds: a note, not an error)."""
    from conftest import REPO, run_verlc

    text = (REPO / "specs" / "retool-sandbox.yaml").read_text()
    wired = 'url: "${services.sandbox.url}/run_code"'
    assert wired in text
    lines = text.replace(wired, 'url: "${services.sandbox.url}/run_code?key=${services.sandbox.token}"').splitlines()
    (tmp_path / "spec.yaml").write_text("\n".join(lines[1:]) + "\n")  # without the schema comment's relative path
    at = next(i for i, line in enumerate(lines[1:], 1) if "sandbox.token" in line)
    shown = run_verlc("validate", "spec.yaml", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert re.search(rf"^spec\.yaml:{at}:\d+: verl\.reward\.sandbox_fusion\.url: note: verl prints its config, "
                     r"resolved, as it starts: each run's token of 'sandbox' will be in the job's log; .* read "
                     r"VERLC_SERVICE_SANDBOX_TOKEN from its environment instead$", shown.stdout + shown.stderr,
                     re.M), shown.stdout + shown.stderr


def test_a_service_sharing_the_gpus_must_fit_beside_the_rollout_or_the_build_is_refused_with_the_numbers(
        tmp_path: Path) -> None:
    """#55 item 3: a service that takes a share of the GPUs' memory (a vLLM judge beside the trainer) and verl's
    rollout (gpu_memory_utilization: the spec's, else the release's default) must fit one GPU on the head."""
    from conftest import REPO, run_verlc

    text = "\n".join((REPO / "specs" / "retool-sandbox.yaml").read_text().splitlines()[1:]) + "\n"
    assert "gpu_memory_utilization: 0.6" in text and "    restart: 2\n" in text
    (tmp_path / "fits.yaml").write_text(text.replace("    restart: 2\n", "    restart: 2\n    gpu_memory: 0.3\n"))
    fits = run_verlc("validate", "fits.yaml", cwd=tmp_path)
    assert fits.returncode == 0, fits.stderr
    planned = run_verlc("plan", "fits.yaml", cwd=tmp_path).stdout  # where it runs, and what it takes
    assert "  service:  sandbox on the head node, in the trainer's nodes (ready within 300 s, sandbox probe); " \
           "0.3 of each GPU's memory beside the rollout's 0.6\n" in planned, planned
    (tmp_path / "over.yaml").write_text(text.replace("    restart: 2\n", "    restart: 2\n    gpu_memory: 0.5\n"))
    over = run_verlc("validate", "over.yaml", cwd=tmp_path)
    at = next(i for i, line in enumerate((tmp_path / "over.yaml").read_text().splitlines(), 1) if "gpu_memory:" in line)
    assert over.returncode == 2 and re.search(
        rf"^over\.yaml:{at}:\d+: services\.sandbox\.gpu_memory: the head node's GPUs hold verl's rollout and the "
        r"services: 0\.6 \(actor_rollout_ref\.rollout\.gpu_memory_utilization\) \+ 0\.5 "
        r"\(services\.sandbox\.gpu_memory\) = 1\.1 of a GPU's memory", over.stderr, re.M), over.stderr
    # without the spec's own value, the release's default is the rollout's share
    default = text.replace(" gpu_memory_utilization: 0.6,", "").replace("    restart: 2\n",
                                                                         "    restart: 2\n    gpu_memory: 0.6\n")
    (tmp_path / "default.yaml").write_text(default)
    defaulted = run_verlc("validate", "default.yaml", cwd=tmp_path)
    assert defaulted.returncode == 2 and re.search(r"verl's rollout and the services: 0\.\d+ \(actor_rollout_ref"
                                                   r"\.rollout\.gpu_memory_utilization\) \+ 0\.6", defaulted.stderr), \
        defaulted.stderr
    assert run_verlc("validate", "over.yaml", cwd=tmp_path).stderr == over.stderr  # the same words each time


JUDGE = "verlc-test/tiny-judge"  # the judge's model, as a hub repo id in the test's own cache


@pytest.fixture(scope="module")
def judge_hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random chat model made here (the GPU rehearsal's: a 2-layer Qwen2, a BPE tokenizer trained on a few
    prompts; dev/gpu/fixtures.py), in a Hugging Face hub cache as the hub client leaves it (blobs, a snapshot of
    links, refs/main): `transformers serve` lists the models of its cache, offline."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "dev" / "gpu"))
    try:
        import fixtures
    finally:
        sys.path.pop(0)
    made = tmp_path_factory.mktemp("judge-model")
    tok = fixtures.tokenizer([q for q, _ in fixtures.problems(64, 1)] + ["Answer with one word: ready?"], made)
    fixtures.model(len(tok), tok, made)
    hub = tmp_path_factory.mktemp("hf") / "hub"
    fixtures.hub(made, JUDGE, hub)
    return hub


def test_an_llm_judge_served_by_transformers_serve_passes_the_judge_probe_and_a_wrong_model_fails_it(
        services, judge_hub: Path) -> None:  # noqa: ANN001
    """The judge probe against a real OpenAI-compatible server (`transformers serve`, on CPU, the tiny model of the
    test's own hub cache, offline): /v1/models lists the spec's model and one chat request is answered by the
    model's generation; the same server asked for a model it does not serve fails the probe, naming the request
    and what the server listed."""
    from dataclasses import replace

    from verlc.runtime.probes import probe_problem

    serve = [[str(Path(sys.executable).parent / "transformers")], ["serve"], [JUDGE], ["--host"],
             [{"env": "VERLC_SERVICE_JUDGE_HOST"}], ["--port"], [{"env": "VERLC_SERVICE_JUDGE_PORT"}],
             ["--device"], ["cpu"]]
    judge = Service(name="judge", argv=serve, env={"HF_HUB_CACHE": [str(judge_hub)], "HF_HUB_OFFLINE": ["1"]},
                    image=None, every_node=False, own_node=False, gpus=0, listen_all=False, ready_http="/health",
                    ready_command=None, deadline=300,
                    probe=Probe(kind="judge", model=JUDGE), restart=0,
                    variables={a: f"VERLC_SERVICE_JUDGE_{a.upper()}" for a in SERVICE_ATTRIBUTES})
    running = services(judge)
    running.start_head("127.0.0.1")
    assert running.ready() == [], running.head["judge"].tail()
    assert running.record["judge"] == {"ready_seconds": running.record["judge"]["ready_seconds"], "probe": "judge",
                                       "probe_passed": True}
    url, token = os.environ["VERLC_SERVICE_JUDGE_URL"], os.environ["VERLC_SERVICE_JUDGE_TOKEN"]
    other = replace(judge, probe=Probe(kind="judge", model="verlc-test/another-judge"))
    problem = probe_problem(other, url, token)
    assert problem and problem.startswith("failed its judge probe: GET /v1/models answered 200 ") and \
        f'"id":"{JUDGE}"' in problem.replace(" ", ""), problem


def test_head_services_are_addressed_at_the_heads_own_address_not_its_names_loopback() -> None:
    """The head's services listen on the address every node reaches the head at: the cluster address's host
    (the Slurm script's head address), never a loopback one (a Debian host's name resolves to 127.0.1.1, which
    the Slurm e2e once handed every node); without one, Ray's pick on this node (compose's head container)."""
    import ray

    from verlc.runtime.cluster import head_address

    assert head_address("10.77.0.5:20200") == "10.77.0.5"
    ours = ray.util.get_node_ip_address()
    assert not ours.startswith("127.")
    assert head_address("127.0.0.1:6379") == head_address("localhost:6379") == head_address("auto") == ours


def test_a_tool_config_for_a_release_without_multi_turn_tools_is_refused_at_its_line(tmp_path: Path) -> None:
    """verl 0.3 has no actor_rollout_ref.rollout.multi_turn.tool_config_path: the spec's tool_config is refused
    there, and an empty tools list too (the shipped 0.3 schema judges it; `--verl-config live` judges only the
    installed release, so this is not in tests/invalid/)."""
    from conftest import run_verlc

    (tmp_path / "old.yaml").write_text(
        "name: d\nproject: p\nverl_version: 0.3.0.post1\nmodel: Qwen/Qwen2.5-0.5B-Instruct\n"
        "data: {train_files: [d/train.parquet], val_files: [d/test.parquet]}\n"
        "cluster: {nodes: 1, gpus_per_node: 8, slurm: {cpus_per_task: 4}}\n"
        "verl: {actor_rollout_ref: {actor: {ppo_micro_batch_size_per_gpu: 4}, rollout: "
        "{log_prob_micro_batch_size_per_gpu: 4}, ref: {log_prob_micro_batch_size_per_gpu: 4}}, "
        "critic: {ppo_micro_batch_size_per_gpu: 4}}\ntool_config: {tools: []}\n")
    shown = run_verlc("validate", "old.yaml", cwd=tmp_path)
    assert shown.returncode == 2, shown.stderr
    assert shown.stderr.splitlines()[:2] == [
        "old.yaml:8:1: tool_config: verl 0.3.0.post1's ppo_trainer has no "
        "actor_rollout_ref.rollout.multi_turn.tool_config_path: this release runs no multi-turn tools",
        "old.yaml:8:14: tool_config: verl reads a list of tools from it: tool_config: {tools: [{class_name: ..., "
        "config: {...}, tool_schema: {...}}]}"], shown.stderr


def test_a_service_on_a_node_of_its_own_adds_that_node_to_every_targets_allocation_not_to_the_trainers(
        tmp_path: Path) -> None:
    """#55 items 1 and 3: specs/genrm-judge.yaml's judge on a node of its own: every target allocates the
    trainer's two nodes and the judge's one (Slurm's --nodes, compose's worker containers, KubeRay's worker
    replicas, SkyPilot's num_nodes), verl's trainer.nnodes stays 2, and `verlc plan` shows both and counts the
    GPU-hours of all three; without the service the allocation is the trainer's alone."""
    from conftest import REPO, run_verlc
    from ruamel.yaml import YAML

    text = (REPO / "specs" / "genrm-judge.yaml").read_text()
    assert "    on: own_node" in text and "  nodes: 2\n" in text
    (tmp_path / "own.yaml").write_text(text)
    # on the head, beside the rollout's 0.5 of each GPU: vLLM's share said by its flag and gpu_memory (#64 item 3)
    (tmp_path / "head.yaml").write_text(text.replace("    on: own_node", "    on: head\n    gpu_memory: 0.3").replace(
        '--max-model-len, "8192"]', '--max-model-len, "8192", --gpu-memory-utilization, "0.3"]'))
    for name, nodes in (("own", 3), ("head", 2)):
        built = run_verlc("build", f"{name}.yaml", "--target", "all", "--out", "out", cwd=tmp_path)
        assert built.returncode == 0, built.stderr
        out = tmp_path / "out" / "genrm-judge"
        assert f"\n#SBATCH --nodes={nodes}\n" in (out / "slurm" / "sbatch.sh").read_text()
        assert '"trainer.nnodes=2"' in (out / "slurm" / "sbatch.sh").read_text()
        compose = YAML(typ="safe").load((out / "compose" / "compose.yaml").read_text())
        assert sorted(s for s in compose["services"] if s.startswith("ray-worker-")) == \
            [f"ray-worker-{i}" for i in range(1, nodes)]
        rayjob = YAML(typ="safe").load((out / "kuberay" / "rayjob.yaml").read_text())
        [group] = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
        assert group["replicas"] == nodes - 1
        assert YAML(typ="safe").load((out / "skypilot" / "task.yaml").read_text())["num_nodes"] == nodes
        planned = run_verlc("plan", f"{name}.yaml", cwd=tmp_path).stdout
        assert planned.startswith(f"genrm-judge: {nodes} node(s)" + (" (2 for the trainer, 1 for services)"
                                                                     if nodes == 3 else "") + " x 8 GPUs (H100) = "
                                  f"{nodes * 8} GPUs;"), planned
        assert f"x {nodes * 8} GPUs = {24 * nodes * 8} GPU-hours" in planned, planned
        assert "rollout, actor share all 16" in planned, planned  # the trainer's GPUs, not the allocation's
        shutil.rmtree(tmp_path / "out")
    assert "  service:  judge on a node of its own, holding 8 of its 8 GPUs (ready within 1200 s, judge probe)" \
        in run_verlc("plan", "own.yaml", cwd=tmp_path).stdout


def test_services_on_nodes_of_their_own_get_the_last_nodes_by_name_never_the_runtimes_own() -> None:
    """One node each, in the spec's order, from the end of the allocation sorted by name; the head (the node the
    runtime runs on) never; none at all where the cluster has too few (the runtime then fails the job naming
    each)."""
    def node(name: str) -> dict:
        return {"NodeID": f"id-{name}", "NodeName": name, "NodeManagerAddress": f"10.0.0.{name[1:]}"}

    def own(name: str) -> Service:
        return replace(sandbox(), name=name, own_node=True)

    nodes = [node(n) for n in ("n3", "n1", "n4", "n2")]
    assert {k: v["NodeName"] for k, v in own_nodes([own("judge"), sandbox(), own("env")], nodes, "id-n4").items()} \
        == {"judge": "n2", "env": "n3"}
    assert {k: v["NodeName"] for k, v in own_nodes([own("judge")], nodes, "id-n1").items()} == {"judge": "n4"}
    assert own_nodes([own("a"), own("b")], nodes[:2], "id-n3") == {}


def test_a_parallel_ray_job_sweep_with_a_service_on_a_node_of_its_own_is_refused_at_its_line(tmp_path: Path) -> None:
    """Variants that run at once on one Ray cluster each pick a node of their own for the service by the same
    rule, the same node (the second's service then waits for its GPUs until its deadline): refused at the
    service's `on`, with what to change; in turn (ray.sweep_parallel: 1) it builds."""
    from conftest import run_verlc

    spec = ("name: d\nproject: p\nmodel: Qwen/Qwen2.5-0.5B-Instruct\n"
            "data: {train_files: [d/train.parquet], val_files: [d/test.parquet]}\n"
            "cluster: {nodes: 1, gpus_per_node: 8, slurm: {cpus_per_task: 4}}\n"
            "verl: {actor_rollout_ref: {actor: {ppo_micro_batch_size_per_gpu: 4}, rollout: "
            "{name: vllm, log_prob_micro_batch_size_per_gpu: 4}, ref: {log_prob_micro_batch_size_per_gpu: 4}}, "
            "critic: {ppo_micro_batch_size_per_gpu: 4}}\n"
            "sweep: {matrix: {verl.actor_rollout_ref.actor.optim.lr: [1e-6, 2e-6]}}\n"
            "ray: {sweep_parallel: 2}\n"
            "services:\n  judge:\n    command: [vllm, serve, m, --port, '${services.judge.port}']\n"
            "    on: own_node\n")
    (tmp_path / "sweep.yaml").write_text(spec)
    shown = run_verlc("validate", "sweep.yaml", "--target", "ray-job", cwd=tmp_path)
    assert shown.returncode == 2 and shown.stderr.splitlines()[0] == (
        "sweep.yaml:12:9: services.judge.on: the variants that run at once on the cluster (ray.sweep_parallel: 2) "
        "would each give services.judge a node of its own by the same choice, the same node: run them in turn "
        "(ray.sweep_parallel: 1), or put judge on the head or every node"), shown.stderr
    (tmp_path / "sweep.yaml").write_text(spec.replace("sweep_parallel: 2", "sweep_parallel: 1"))
    assert run_verlc("validate", "sweep.yaml", "--target", "ray-job", cwd=tmp_path).returncode == 0


IMAGE_SPEC = ("name: d\nproject: p\nmodel: Qwen/Qwen2.5-0.5B-Instruct\n"
              "data: {train_files: [d/train.parquet], val_files: [d/test.parquet]}\n"
              "cluster: {nodes: 1, gpus_per_node: 8, slurm: {cpus_per_task: 4}}\n"
              "container: {runtime: podman, image: 'verlai/verl:vllm024.latest', workdir: /w}\n"
              "compose: {image: 'verlai/verl:vllm024.latest', workdir: /w}\n"
              "verl: {actor_rollout_ref: {actor: {ppo_micro_batch_size_per_gpu: 4}, rollout: "
              "{name: vllm, log_prob_micro_batch_size_per_gpu: 4}, ref: {log_prob_micro_batch_size_per_gpu: 4}}, "
              "critic: {ppo_micro_batch_size_per_gpu: 4}}\n"
              "services:\n  sandbox:\n    image: 'volcengine/sandbox-fusion:server-20250609'\n")


def test_a_service_in_an_image_of_its_own_builds_for_slurm_and_compose_and_is_refused_at_its_line_elsewhere(
        tmp_path: Path) -> None:
    """#55 item 1: slurm (docker, podman), compose and kuberay start the image's container; ray-job and skypilot
    cannot, and say so at services.NAME.image; so does slurm with apptainer. What the runtime cannot do to a
    container it does not own (restart it, put it off the head, give it GPUs) is refused where the spec says it,
    and a service with neither a command nor an image at the service."""
    from conftest import run_verlc

    (tmp_path / "s.yaml").write_text(IMAGE_SPEC)
    for target in ("slurm", "compose", "kuberay"):
        built = run_verlc("validate", "s.yaml", "--target", target, cwd=tmp_path)
        assert built.returncode == 0, (target, built.stderr)
    for target in ("ray-job", "skypilot"):
        refused = run_verlc("validate", "s.yaml", "--target", target, cwd=tmp_path)
        assert refused.returncode == 2 and (
            f"s.yaml:11:5: services.sandbox.image: the {target} target cannot run services.sandbox in an image of "
            f"its own: ") in refused.stderr, (target, refused.stderr)
    (tmp_path / "a.yaml").write_text(IMAGE_SPEC.replace("runtime: podman", "runtime: pyxis"))
    pyxis = run_verlc("validate", "a.yaml", "--target", "slurm", cwd=tmp_path)
    assert pyxis.returncode == 2 and "a.yaml:11:5: services.sandbox.image: the slurm target cannot run " \
        "services.sandbox in an image of its own: verlc starts a service's own image with docker, podman or " \
        "apptainer (container.runtime), not yet with pyxis" in pyxis.stderr, pyxis.stderr
    # apptainer: `apptainer run` of the image (its own runscript) with the args, in the step's env; nothing to remove
    own = "command: [--port, '${services.sandbox.port}']\n    env: {MODE: fast}\n    image: 'volcengine"
    (tmp_path / "c.yaml").write_text(IMAGE_SPEC.replace("runtime: podman", "runtime: apptainer").replace(
        "image: 'volcengine", own))
    built = run_verlc("build", "c.yaml", "--target", "slurm", "--out", "out", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    script = (tmp_path / "out" / "d" / "slurm" / "sbatch.sh").read_text()
    assert "      service_run=(\n        apptainer run\n        --env MODE=fast\n        " \
           "volcengine/sandbox-fusion:server-20250609 --port \"${VERLC_SERVICE_SANDBOX_PORT}\"\n      )\n" \
           "      service_remove=()\n" in script, script
    from conftest import require_tool

    checked = subprocess.run([require_tool("shellcheck"), "-"], input=script, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
    (tmp_path / "b.yaml").write_text(IMAGE_SPEC + "    on: every_node\n    restart: 1\n    gpu_memory: 0.2\n"
                                     "  nothing: {ready: {http: /health}}\n")
    bad = run_verlc("validate", "b.yaml", "--target", "slurm", cwd=tmp_path).stderr
    assert "b.yaml:12:9: services.sandbox.on: services.sandbox runs in an image of its own, whose container the " \
           "target starts on the head node: it cannot be on every_node" in bad, bad
    assert "b.yaml:13:14: services.sandbox.restart: services.sandbox runs in an image of its own" in bad, bad
    assert "b.yaml:14:5: services.sandbox.gpu_memory: services.sandbox runs in an image of its own" in bad, bad
    assert "b.yaml:15:3: services.nothing: services.nothing runs a command in the job's image (command: [...]) " \
           "or an image of its own (image: ...): it has neither" in bad, bad


def test_an_address_written_by_hand_beside_services_is_noted_at_its_line(tmp_path: Path) -> None:
    """#64 item 4: a verl setting (or tool config) that names localhost:PORT while the spec has services reaches
    no service of this run: a note at its line; ${services.NAME.url} in its place takes none."""
    from conftest import run_verlc

    spec = """name: site
project: p
model: /models/m
data: {train_files: [/d/train.parquet], val_files: [/d/test.parquet]}
cluster: {nodes: 1, gpus_per_node: 8, slurm: {cpus_per_task: 32}}
container: {runtime: none}
secrets: [WANDB_API_KEY]
verl: {algorithm: {adv_estimator: grpo}, actor_rollout_ref: {actor: {ppo_micro_batch_size_per_gpu: 4},
                           rollout: {name: vllm, n: 4, log_prob_micro_batch_size_per_gpu: 4}},
       reward: {sandbox_fusion: {url: "URL/run_code"}}}
services:
  sandbox:
    command: [python3, s.py, --port, "${services.sandbox.port}"]
"""
    (tmp_path / "fixed.yaml").write_text(spec.replace("URL", "http://localhost:8080"))
    (tmp_path / "wired.yaml").write_text(spec.replace("URL", "${services.sandbox.url}"))
    fixed, wired = (run_verlc("validate", f"{n}.yaml", cwd=tmp_path) for n in ("fixed", "wired"))
    assert fixed.returncode == 0 and wired.returncode == 0, fixed.stderr + wired.stderr
    assert "fixed.yaml:10:39: verl.reward.sandbox_fusion.url: note: http://localhost:8080 is an address written by " \
           "hand while the spec has services (sandbox)" in fixed.stdout + fixed.stderr
    assert "written by hand" not in wired.stdout + wired.stderr


def test_the_slurm_scripts_header_names_each_service_where_it_runs_its_port_readiness_and_probe() -> None:
    """#64 item 10: what a reviewer reads at the top of sbatch.sh, for every example with services."""
    from conftest import REPO
    from ruamel.yaml import YAML

    seen = 0
    for script in sorted((REPO / "out").glob("*/slurm/sbatch.sh")):
        spec = YAML(typ="safe").load(script.parent / "spec.yaml")
        header = script.read_text().split("\nset -euo pipefail\n")[0]
        for name, service in (spec.get("services") or {}).items():
            seen += 1
            line = next((l for l in header.splitlines() if l.startswith(f"#   {name}: on ")), None)
            assert line is not None, (script, header)
            assert f"port $VERLC_SERVICE_{name.upper()}_PORT" in line
            where = {"head": "the head node", "every_node": "every node", "own_node": "a node of its own"}
            assert where[service.get("on", "head")] in line, line
            detail = header.splitlines()[header.splitlines().index(line) + 1]
            ready = service.get("ready") or {}
            assert (f"GET {ready['http']} answers 2xx" if ready.get("http") else "ready when") in detail, detail
            if service.get("probe"):
                assert f"one {service['probe']['kind']} request" in detail, detail
    assert seen >= 3


def test_a_services_time_to_ready_is_measured_from_its_start_not_when_the_preflight_asks(
        services) -> None:  # noqa: ANN001
    """#64 item 8: the watch asks each service from its start, so a sandbox ready in a second is not charged with
    the bring-up that ran before the preflight asked."""
    running = services(sandbox())
    running.start_head("127.0.0.1")
    started = running.head["sandbox"].started
    deadline = time.monotonic() + 60
    while running.watch.seen("sandbox") is None and time.monotonic() < deadline:
        time.sleep(0.1)
    seen = running.watch.seen("sandbox")
    assert seen is not None
    time.sleep(2)  # the bring-up and the preflight's other checks, meanwhile
    assert running.ready() == []
    seconds = running.record["sandbox"]["ready_seconds"]
    assert seconds == round(seen - started, 1) and seconds < time.monotonic() - started - 1.5, seconds
    running.stop()


def test_a_service_that_dies_before_training_is_started_again_and_its_tail_is_its_own(services, tmp_path: Path,
                                                                                       capsys) -> None:  # noqa: ANN001
    """#64 item 9: restart covers the bring-up too: a service that exits before it was ready is started again (up
    to its count) and is then ready; a service that keeps dying fails with its own last lines, not its
    predecessor's again; and ready.deadline counts from its first start."""
    mark = tmp_path / "died-once"
    script = (f'if [ ! -e {mark} ]; then touch {mark}; echo "first start: dying"; exit 3; fi; '
              f'exec {sys.executable} {SERVERS / "sandbox.py"} --host "$VERLC_SERVICE_SANDBOX_HOST" '
              f'--port "$VERLC_SERVICE_SANDBOX_PORT"')
    flaky = sandbox(restart=1, argv=[["bash"], ["-c"], [script]])
    running = services(flaky)
    running.start_head("127.0.0.1")
    assert running.ready() == []
    assert running.restarts["sandbox"] == 1
    shown = capsys.readouterr().out
    assert "service sandbox exited with code 3" in shown and "starting it again (1 of 1)" in shown, shown
    running.stop()
    # one that dies at every start: its second death shows its own line once, not the first one's as well
    always = sandbox(restart=1, argv=[["bash"], ["-c"], ['echo "start at $(date +%s%N)"; exit 4']])
    dying = services(always)
    dying.start_head("127.0.0.1")
    problems = dying.ready()
    assert len(problems) == 1 and problems[0].startswith("service sandbox exited with code 4"), problems
    shown = capsys.readouterr().out
    tails = [line for line in shown.splitlines() if line.startswith("[service sandbox] start at ")]
    assert len(tails) == 2 and tails[0] != tails[1], shown  # each death's own line, once each
