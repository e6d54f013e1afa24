"""README's quick start works as printed: every command of its quick-start block, run by bash from the
repository root against what `make run` starts (the simulator as `scripts/run_local.sh` starts it, and the
scheduler on `configs/example.toml`), answers.

The one liberty taken is the ports: the stack listens on free ports instead of 8000, 50051, 8080 and 9464
(so the test runs beside anything else on the machine), and the commands are pointed at them: each
`127.0.0.1:50051` and `127.0.0.1:8080` is replaced, and `llmsched` commands, which rely on the default
address, get `--target`."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engines import free_port

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- quick-start:"


def quick_start_commands() -> list[str]:
    """The commands of README's quick-start block: one per line, a here-document with its body."""
    readme = (ROOT / "README.md").read_text()
    assert readme.count(MARKER) == 1, "README.md lost its quick-start marker"
    block = re.search(r"```bash\n(.*?)```", readme[readme.index(MARKER) :], re.DOTALL)
    assert block is not None, "no bash block after the quick-start marker"
    commands: list[str] = []
    lines = iter(block.group(1).splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        command = line
        if heredoc := re.search(r"<<'?(\w+)'?", line):
            end = heredoc.group(1)
            for body in lines:
                command += "\n" + body
                if body == end:
                    break
        commands.append(command)
    return commands


@dataclass(frozen=True)
class Ports:
    engine: int
    grpc: int
    http: int
    metrics: int


def simulator_arguments(engine_port: int) -> list[str]:
    """The simulator's arguments as `make run` passes them (scripts/run_local.sh), on another port."""
    script = (ROOT / "scripts" / "run_local.sh").read_text()
    line = re.search(r'"\$bin/llmsched" (sim [^&\n]*)&', script)
    assert line is not None, "scripts/run_local.sh no longer starts the simulator as this test expects"
    args = shlex.split(line.group(1))
    args[args.index("--port") + 1] = str(engine_port)
    return args


def example_config(ports: Ports) -> str:
    """configs/example.toml with its addresses moved to the free ports."""
    text = (ROOT / "configs" / "example.toml").read_text()
    config = tomllib.loads(text)
    assert config["server"]["listen"] == "127.0.0.1:50051" and config["server"]["http_listen"] == "127.0.0.1:8080"
    for old, new in [
        ("127.0.0.1:50051", f"127.0.0.1:{ports.grpc}"),
        ("127.0.0.1:8080", f"127.0.0.1:{ports.http}"),
        ("127.0.0.1:9464", f"127.0.0.1:{ports.metrics}"),
        ("http://127.0.0.1:8000", f"http://127.0.0.1:{ports.engine}"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    return text


def _wait_http(url: str, proc: subprocess.Popen[bytes], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args!r} exited with {proc.returncode}"
        with contextlib.suppress(OSError):
            urllib.request.urlopen(url, timeout=1)
            return
        time.sleep(0.1)
    raise TimeoutError(url)


@pytest.fixture(scope="module")
def make_run() -> Iterator[Ports]:
    """The simulator and the scheduler as `make run` starts them, on free ports."""
    ports = Ports(free_port(), free_port(), free_port(), free_port())
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "example.toml"
        config.write_text(example_config(ports))
        cli = [sys.executable, "-m", "scheduler_svc.app.cli"]
        try:
            sim = subprocess.Popen([*cli, *simulator_arguments(ports.engine)], cwd=ROOT, stdout=subprocess.DEVNULL)
            procs.append(sim)
            _wait_http(f"http://127.0.0.1:{ports.engine}/health", sim)
            serve = subprocess.Popen([*cli, "serve", "--config", str(config)], cwd=ROOT, stdout=subprocess.DEVNULL)
            procs.append(serve)
            _wait_http(f"http://127.0.0.1:{ports.http}/readyz", serve)
            yield ports
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def pointed_at(command: str, ports: Ports) -> str:
    """The command with the default addresses replaced by the test stack's."""
    command = command.replace("127.0.0.1:50051", f"127.0.0.1:{ports.grpc}")
    command = command.replace("127.0.0.1:8080", f"127.0.0.1:{ports.http}")
    llmsched = re.match(r"^(\S*llmsched) (submit|stream) ", command)
    if llmsched and "--target" not in command:
        command = f"{llmsched.group(0)}--target 127.0.0.1:{ports.grpc} " + command[llmsched.end() :]
    if not (ROOT / ".venv" / "bin").is_dir():  # run outside the Makefile's venv: this interpreter's bin
        command = command.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    return command


COMMANDS = quick_start_commands()

# what each kind of command must print, beyond succeeding with some output
EXPECTED = [
    (r"grpcurl .* list$", "llmsched.v1.SchedulerService"),
    (r"grpcurl .*/Stream$", '"finished"'),
]


def test_the_quick_start_shows_three_ways_to_call() -> None:
    joined = "\n".join(COMMANDS)
    assert "llmsched stream" in joined and "grpcurl" in joined and "import openai" in joined
    assert all(c.startswith(".venv/bin/") for c in COMMANDS), "every command runs from the checkout's venv"


@pytest.mark.parametrize("command", COMMANDS, ids=[c.split("\n")[0][:60] for c in COMMANDS])
def test_each_quick_start_command_answers(command: str, make_run: Ports) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSCHED_")}  # no stray key or address
    done = subprocess.run(
        ["bash", "-c", pointed_at(command, make_run)], cwd=ROOT, capture_output=True, text=True, timeout=90, env=env
    )
    assert done.returncode == 0, f"{command}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    assert done.stdout.strip(), f"{command} printed nothing"
    first_line = command.split("\n")[0]
    for pattern, expected in EXPECTED:
        if re.search(pattern, first_line):
            assert expected in done.stdout, done.stdout
