"""The container image recipe, run without a container runtime (none on these machines): the Dockerfile's
build stage is replayed into a fresh virtual environment from the files its COPY lines and .dockerignore let
into the context, and its ENTRYPOINT, CMD and HEALTHCHECK are run from there against the simulator with
the Kubernetes ConfigMap's config.

What differs from a real build: paths move under a temporary folder (/opt/llmsched, /etc/llmsched), the
listeners bind 127.0.0.1 on free ports, and the dependencies are not downloaded (`pip install --no-deps`)
but taken from the test's own environment, which installed the same pyproject.toml ranges. What is the
same: the base interpreter's minor version, the build command, the package the wheel holds (so a module
the COPY lines miss fails here), the console script the entrypoint names, and the command lines.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import sysconfig
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from engines import free_port
from tests.deploy import dockerfile
from tests.deploy.manifests import (
    config_raw,
    config_text,
    mounted_files,
    port_of,
    scheduler_container,
)
from tests.helpers import REPO_ROOT, eventually

VENV = "/opt/llmsched"
EXPECTED_PORTS = {"grpc": 50051, "http": 8080, "metrics": 9464}


def test_the_recipe_is_multi_stage_pinned_unprivileged_and_declares_the_three_ports() -> None:
    build, *_, runtime = stages = dockerfile.stages()
    assert len(stages) >= 2 and build.name, "a named build stage and a runtime stage"
    for stage in stages:
        tag = stage.base.partition("@")[0].rpartition(":")[2]
        assert "@sha256:" in stage.base or re.fullmatch(r"\d+\.\d+\.\d+-slim(-\w+)?", tag), stage.base
    assert {s.base for s in stages} == {build.base}, "the venv is copied into the base it was built on"
    assert f"--from={build.name} {VENV} {VENV}" in runtime.all("COPY")
    assert not runtime.all("RUN pip") and all("pip install" not in r for r in runtime.all("RUN"))
    user = runtime.one("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or int(gid) > 0), "numeric and not root"
    assert {int(p) for p in runtime.one("EXPOSE").split()} == set(EXPECTED_PORTS.values())
    assert dockerfile.env(runtime)["PATH"].startswith(f"{VENV}/bin:")
    options, command = dockerfile.healthcheck(runtime)
    assert command[:2] == ["llmsched", "health"] and {"interval", "timeout", "start-period", "retries"} <= set(options)
    assert dockerfile.exec_form(runtime.one("ENTRYPOINT")) == ["llmsched"]
    (run,) = build.all("RUN")
    assert "pip install" in run and "[" not in run, "the service's own dependencies only: no extras"


def test_the_build_context_holds_what_the_copy_lines_need_and_nothing_else() -> None:
    build = dockerfile.stages()[0]
    rules = dockerfile.ignore_rules()
    sources = [src for line in build.all("COPY") for src in line.split()[:-1]]
    files = _context_files()
    for src in sources:
        assert any(f == src.rstrip("/") or f.startswith(src) for f in files), f"COPY {src}: nothing in the context"
    assert not any(f.startswith(("tests/", "bench/", ".venv/", ".cache/", "clients/node/")) for f in files)
    assert not dockerfile.ignored("scheduler_svc/server.py", rules)
    assert dockerfile.ignored("scheduler_svc/__pycache__/server.cpython-311.pyc", rules)


def test_the_kubernetes_deployment_runs_the_image_command_on_its_ports() -> None:
    runtime = dockerfile.stages()[-1]
    container = scheduler_container()
    assert container["args"] == dockerfile.exec_form(runtime.one("CMD"))
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == EXPECTED_PORTS
    server = config_raw()["server"]
    listeners = {"grpc": server["listen"], "http": server["http_listen"], "metrics": server["metrics_listen"]}
    assert {name: port_of(address) for name, address in listeners.items()} == EXPECTED_PORTS
    _, command = dockerfile.healthcheck(runtime)
    target = command[command.index("--target") + 1]
    assert target == f"127.0.0.1:{EXPECTED_PORTS['grpc']}"


def _context_files() -> list[str]:
    """The files a build from this checkout sends: tracked and untracked-but-not-ignored, less .dockerignore's."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    rules = dockerfile.ignore_rules()
    return [f for f in listed if (REPO_ROOT / f).is_file() and not dockerfile.ignored(f, rules)]


def _replay_build(root: Path) -> Path:
    """Run the build stage's COPY and RUN lines under `root`; returns the virtual environment."""
    build = dockerfile.stages()[0]
    workdir = root / build.one("WORKDIR").lstrip("/")
    workdir.mkdir(parents=True)
    files = _context_files()
    for line in build.all("COPY"):
        *sources, dest = line.split()
        for src in sources:
            for f in files:
                if f == src or (src.endswith("/") and f.startswith(src)):
                    # a folder's contents land in dest; a file lands in dest by its name
                    relative = f.removeprefix(src) if src.endswith("/") else Path(f).name
                    target = workdir / dest / relative
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes((REPO_ROOT / f).read_bytes())
    venv = root / VENV.lstrip("/")
    (run,) = build.all("RUN")
    command = run.replace(VENV, str(venv))
    assert command.count(" install ") == 1
    command = command.replace(" install ", " install --no-deps ")  # dependencies: see the module's docstring
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    # `python` is the image's interpreter: here the one under the test's venv, of the same minor version
    image_bin = root / "usr-local-bin"
    image_bin.mkdir()
    (image_bin / "python").symlink_to(sys._base_executable)  # type: ignore[attr-defined]
    env["PATH"] = f"{image_bin}:{env['PATH']}"
    subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=workdir, env=env, check=True, timeout=300)
    site = Path(
        subprocess.run(
            [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _installed(venv: Path) -> tuple[Path, set[str]]:
    """The venv's site-packages and what the build put there (less the test's own link to the dependencies)."""
    site = next(venv.glob("lib/python3*/site-packages"))
    return site, {p.name for p in site.iterdir()} - {"test-dependencies.pth", "__pycache__"}


@asynccontextmanager
async def process(*argv: str, env: dict[str, str], cwd: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def run(*argv: str, env: dict[str, str], cwd: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


@pytest.mark.timeout(300)
async def test_entrypoint_cmd_and_healthcheck_run_the_service_from_a_venv_built_as_the_image_builds_it(
    tmp_path: Path,
) -> None:
    runtime = dockerfile.stages()[-1]
    venv = await asyncio.to_thread(_replay_build, tmp_path)
    site, installed = await asyncio.to_thread(_installed, venv)
    assert installed == {"llmsched", "scheduler_svc", "backends", "clients", "llm_scheduler-0.1.0.dist-info"}, (
        "the service's packages alone: no pip, no setuptools, no engine tools, no tests"
    )
    code, where = await run(
        str(venv / "bin" / "python"), "-c", "import scheduler_svc; print(scheduler_svc.__file__)", env={}, cwd=tmp_path
    )  # fmt: skip
    assert code == 0 and where.startswith(str(site)), where

    env = {**os.environ, **dockerfile.env(runtime)}
    env["PATH"] = env["PATH"].replace(f"{VENV}/bin", str(venv / "bin")).replace("$PATH", os.environ["PATH"])
    env.pop("VIRTUAL_ENV", None)
    env["LLMSCHED_REDIS_PASSWORD"] = "unused in memory mode"
    entrypoint = dockerfile.exec_form(runtime.one("ENTRYPOINT"))
    cmd = dockerfile.exec_form(runtime.one("CMD"))
    _, health = dockerfile.healthcheck(runtime)
    assert entrypoint == ["llmsched"] and health[0] == "llmsched"
    llmsched = str(venv / "bin" / "llmsched")  # what PATH resolves `llmsched` to in the image

    # The ConfigMap's config as the pod sees it, moved to free loopback ports, in front of the simulator,
    # one process (the Redis part is the cluster tests' business).
    mounted_files(tmp_path)
    config_path = Path(cmd[cmd.index("--config") + 1])
    raw = config_raw()
    ports = {key: free_port() for key in ("listen", "http_listen", "metrics_listen")}
    sim_port = free_port()
    backend = raw["models"][0]["backends"][0]
    text = config_text().replace("/etc/llmsched/", f"{tmp_path}/etc/llmsched/")
    for key, port in ports.items():
        text, n = re.subn(rf'(?m)^{key} = "0\.0\.0\.0:\d+"', f'{key} = "127.0.0.1:{port}"', text)
        assert n == 1, key
    text = re.sub(r'(?m)^store = "redis"', 'store = "memory"', text)
    text = text[: text.index("[[models.backends]]")] + "\n".join(
        [
            "[[models.backends]]",
            f'name = "{backend["name"]}"',
            'kind = "vllm"',
            f'url = "http://127.0.0.1:{sim_port}"',
            f'engine_model = "{backend["engine_model"]}"',
            f"max_num_seqs = {backend['max_num_seqs']}",
            "",
        ]
    )
    (tmp_path / config_path.relative_to("/")).write_text(text)
    serve = [llmsched, *cmd[:-1], str(tmp_path / config_path.relative_to("/"))]
    target = f"127.0.0.1:{ports['listen']}"
    image_target = f"127.0.0.1:{EXPECTED_PORTS['grpc']}"
    probe = [llmsched, *[target if a == image_target else a for a in health[1:]]]
    assert target in probe

    sim = [llmsched, "sim", "--port", str(sim_port), "--served-model-name", backend["engine_model"]]
    async with process(*sim, env=env, cwd=tmp_path), process(*serve, env=env, cwd=tmp_path) as server:

        async def engine_up() -> bool:
            try:
                await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{sim_port}/health", timeout=1)
                return True
            except OSError:
                return False

        async def healthy() -> bool:
            assert server.returncode is None, (await server.stdout.read()).decode()  # type: ignore[union-attr]
            return (await run(*probe, env=env, cwd=tmp_path))[0] == 0

        await eventually(engine_up, 30, "the simulator answering", every=0.2)  # another process: no event
        await eventually(healthy, 60, "HEALTHCHECK passing", every=0.2)  # as Docker retries a HEALTHCHECK
        code, out = await run(
            llmsched, "submit", "--target", target, "--api-key", "team-a-example-key",
            "--model", raw["models"][0]["name"], "--max-tokens", "8", "hello",
            env=env, cwd=tmp_path,
        )  # fmt: skip
        assert code == 0 and f"via {backend['name']}" in out, out
        metrics = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics_listen']}/metrics").read().decode()
        )
        model = raw["models"][0]["name"]
        assert f'llmsched_queued_prompt_tokens{{model="{model}",priority_class="batch"}} 0.0' in metrics, metrics

        server.send_signal(signal.SIGTERM)  # what the kubelet sends after the preStop hook
        grace = raw["server"]["shutdown_grace_seconds"]
        assert await asyncio.wait_for(server.wait(), grace + 10) == 0
        assert (await run(*probe, env=env, cwd=tmp_path))[0] == 1, "nothing serves after the drain"
