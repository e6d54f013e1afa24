"""The layers at run time: what importing the core loads, the lazy adapter registry, the gRPC error table.

import-linter (`lint-imports`, in `make check`) sees only static imports; these tests check what a fresh
interpreter actually loads, which also catches imports made through importlib or a package's `__init__`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from backends import errors as backend_errors
from backends.base import BackendSpec
from backends.registry import BACKEND_KINDS, adapter_class, create_backend
from scheduler_svc.config import BackendConfig
from scheduler_svc.core import errors
from scheduler_svc.grpc.status import status_code, to_grpc_status

ROOT = Path(__file__).resolve().parents[2]
# modules the core must never load: the wire, generated code, HTTP clients, and the adapters
WIRE = ("grpc", "grpc_status", "grpc_health", "grpc_reflection", "google.rpc", "google.protobuf", "aiohttp")
ADAPTERS = (
    "backends.adapters.vllm",
    "backends.adapters.tgi",
    "backends.adapters.llamacpp",
    "backends.http",
    "backends.adapters.openai_compat",
)
GENERATED = ("llmsched",)  # the public API package: generated messages


def loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter has loaded after running `code` (with this checkout first on the path)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    modules: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return modules


def offending(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


INNER = ("config", "core", "policies", "dispatch")  # the packages under the faces: every module of them


def inner_modules() -> list[str]:
    modules = []
    for package in INNER:
        for path in sorted((ROOT / "scheduler_svc" / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


CORE = [*inner_modules(), "backends"]


def test_importing_the_core_loads_no_grpc_aiohttp_generated_code_or_adapter() -> None:
    """One interpreter imports them all: if together they load none of these, neither does any one alone."""
    modules = loaded_after("\n".join(f"import {module}" for module in CORE))
    assert set(CORE) <= set(modules)
    assert offending(modules, WIRE + ADAPTERS + GENERATED) == []


def test_a_config_loads_only_the_adapter_of_the_kind_it_names() -> None:
    code = (
        "from scheduler_svc.app.settings import config_from_dict\n"
        "config_from_dict({'models': [{'name': 'm', 'backends': [{'name': 'b', 'kind': 'tgi',"
        " 'url': 'http://127.0.0.1:1'}]}]})"
    )
    modules = loaded_after(code)
    assert "backends.adapters.tgi" in modules
    assert offending(modules, ("backends.adapters.vllm", "backends.adapters.llamacpp", "grpc", *GENERATED)) == []


def test_the_registry_is_the_one_list_of_kinds() -> None:
    assert BACKEND_KINDS == ("vllm", "tgi", "llamacpp")
    assert {_class_name(kind) for kind in BACKEND_KINDS} == {"VllmBackend", "TgiBackend", "LlamaCppBackend"}
    assert "one of vllm, tgi, llamacpp" in BackendConfig.__dataclass_fields__["kind"].metadata["doc"]
    with pytest.raises(ValueError, match="unknown backend kind 'nope'"):
        create_backend("nope", BackendSpec(name="b", url="http://127.0.0.1:1", engine_model="m"))


# What each exception answers: the code and reason of the error table, from the one mapping in grpc_errors.
EXPECTED_STATUS = [
    (errors.SchedulerError("x"), grpc.StatusCode.INTERNAL, "INTERNAL"),
    (errors.InternalError("x"), grpc.StatusCode.INTERNAL, "INTERNAL"),
    (errors.InvalidRequest("x"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
    (errors.PromptTooLarge("x", limit=3), grpc.StatusCode.INVALID_ARGUMENT, "PROMPT_TOO_LARGE"),
    (errors.MalformedRequest("x"), grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST"),
    (errors.UnsupportedContentType("x"), grpc.StatusCode.INVALID_ARGUMENT, "UNSUPPORTED_CONTENT_TYPE"),
    (errors.ModelNotFound("x"), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
    (errors.Unauthenticated("x"), grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"),
    (errors.PermissionDenied("x"), grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"),
    (errors.AlreadyExists("x"), grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_IN_USE"),
    (errors.QueueFull("x", retry_after_seconds=1.0), grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL"),
    (errors.QueueBytesFull("x", retry_after_seconds=1.0), grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_BYTES_FULL"),
    (errors.QueueTimeout("x"), grpc.StatusCode.DEADLINE_EXCEEDED, "QUEUE_TIMEOUT"),
    (errors.InvalidField("x", "y"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
    (errors.ShuttingDown("x"), grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN"),
    (errors.DeadlineExceeded("x"), grpc.StatusCode.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"),
    (errors.ReadTimeout("x"), grpc.StatusCode.DEADLINE_EXCEEDED, "READ_TIMEOUT"),
    (errors.ReadCapacityFull("x"), grpc.StatusCode.UNAVAILABLE, "READ_CAPACITY_FULL"),
    (errors.BackendNotFound("x"), grpc.StatusCode.NOT_FOUND, "BACKEND_NOT_FOUND"),
    (errors.ConfigRefused("x"), grpc.StatusCode.INTERNAL, "INTERNAL"),  # the base: a refusal is always one of its kinds
    (errors.ConfigInvalid("x"), grpc.StatusCode.FAILED_PRECONDITION, "CONFIG_INVALID"),
    (errors.ConfigNeedsRestart("x"), grpc.StatusCode.FAILED_PRECONDITION, "CONFIG_NEEDS_RESTART"),
    (backend_errors.BackendError("x"), grpc.StatusCode.INTERNAL, "BACKEND_ERROR"),
    (backend_errors.BackendUnavailable("x"), grpc.StatusCode.UNAVAILABLE, "BACKEND_UNAVAILABLE"),
    (backend_errors.BackendOverloaded("x"), grpc.StatusCode.RESOURCE_EXHAUSTED, "BACKEND_OVERLOADED"),
    (backend_errors.BackendRejectedRequest("x"), grpc.StatusCode.INVALID_ARGUMENT, "BACKEND_REJECTED_REQUEST"),
    (backend_errors.BackendProtocolError("x"), grpc.StatusCode.INTERNAL, "BACKEND_PROTOCOL_ERROR"),
    (ValueError("x"), grpc.StatusCode.INTERNAL, "INTERNAL"),
]


@pytest.mark.parametrize(("exc", "code", "reason"), EXPECTED_STATUS, ids=lambda v: type(v).__name__)
def test_the_grpc_face_maps_every_exception_to_its_status_and_reason(
    exc: Exception, code: grpc.StatusCode, reason: str
) -> None:
    assert status_code(exc) is code
    status = to_grpc_status(exc)
    assert status.code is code
    (details,) = [value for key, value in status.trailing_metadata if key == "grpc-status-details-bin"]
    info = error_details_pb2.ErrorInfo()
    assert status_pb2.Status.FromString(details).details[0].Unpack(info)
    assert (info.reason, info.domain) == (reason, "llmsched.v1")


def test_every_exception_class_has_a_mapped_status() -> None:
    classes = {type(exc) for exc, _, _ in EXPECTED_STATUS} - {ValueError}
    every = {cls for base in (errors.SchedulerError, backend_errors.BackendError) for cls in [base, *_subclasses(base)]}
    assert every <= classes, f"not in the expected table: {every - classes}"


def _class_name(kind: str) -> str:
    cls = adapter_class(kind)
    assert isinstance(cls, type), f"the registry gives a class for {kind!r}"
    return cls.__name__


def _subclasses(cls: type) -> list[type]:
    direct: list[type] = cls.__subclasses__()
    return [sub for child in direct for sub in (child, *_subclasses(child))]
