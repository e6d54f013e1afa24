"""`llmsched health`, what a container's HEALTHCHECK and a TLS exec probe run: exit 0 only on SERVING, from
its own process against a live server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import trustme
from grpc_health.v1 import health_pb2

from engines import free_port
from tests.helpers import ControlledEngine, make_config, serving


async def health(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "scheduler_svc.app.cli", "health", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_serving_exits_0_and_anything_else_exits_1() -> None:
    async with serving(make_config(), ControlledEngine().factory()) as server:
        assert await health("--target", server.address) == (0, "SERVING\n")
        code, out = await health("--target", server.address, "--service", "llmsched.v1.SchedulerService")
        assert (code, out) == (0, "SERVING\n")
        code, out = await health("--target", server.address, "--service", "no.such.Service")
        assert code == 1 and "NOT_FOUND" in out
        await server._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)  # as a wedged loop makes it
        assert await health("--target", server.address) == (1, "NOT_SERVING\n")


async def test_no_server_exits_1_within_the_timeout() -> None:
    code, out = await health("--target", f"127.0.0.1:{free_port()}", "--timeout", "0.5")
    assert code == 1 and ("UNAVAILABLE" in out or "DEADLINE_EXCEEDED" in out), out


async def test_unreadable_tls_files_exit_2() -> None:
    code, out = await health("--ca-cert", "/nonexistent/ca.pem")
    assert code == 2 and "ca.pem" in out


async def test_over_mutual_tls_with_the_connection_flags(tmp_path: Path) -> None:
    """With TLS on, the kubelet's gRPC probe cannot connect; `llmsched health` with the CA (and, for mutual
    TLS, a client certificate) is the exec probe that can."""
    ca = trustme.CA()
    files = {name: tmp_path / name for name in ("server.pem", "server.key", "ca.pem", "probe.pem", "probe.key")}
    served, probe = ca.issue_cert("127.0.0.1"), ca.issue_cert("probe.local")
    served.cert_chain_pems[0].write_to_path(str(files["server.pem"]))
    served.private_key_pem.write_to_path(str(files["server.key"]))
    probe.cert_chain_pems[0].write_to_path(str(files["probe.pem"]))
    probe.private_key_pem.write_to_path(str(files["probe.key"]))
    ca.cert_pem.write_to_path(str(files["ca.pem"]))
    tls = {"tls_cert_file": str(files["server.pem"]), "tls_key_file": str(files["server.key"])}
    config = make_config(server={**tls, "tls_client_ca_file": str(files["ca.pem"])})
    async with serving(config, ControlledEngine().factory()) as server:
        target = ("--target", server.address, "--timeout", "2")
        client = ("--client-cert", str(files["probe.pem"]), "--client-key", str(files["probe.key"]))
        assert await health(*target, "--ca-cert", str(files["ca.pem"]), *client) == (0, "SERVING\n")
        code, _ = await health(*target, "--ca-cert", str(files["ca.pem"]))  # no client certificate
        assert code == 1
        code, _ = await health(*target)  # plaintext against a TLS port
        assert code == 1
