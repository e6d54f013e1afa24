"""Generate llmsched's public API package from protos/: the typed Python gRPC code.

This is the only way generated code enters the tree. protos/llmsched/v1/*.proto becomes
llmsched/v1/*_pb2.py, *_pb2_grpc.py (only for protos with a service) and their .pyi stubs (the proto package
is the Python package, so the imports grpcio-tools emits work as they are); the hand-written modules of the
package (`__init__.py`, `errors.py`) are never touched. The error table in docs/api.md is rendered from
`llmsched.v1.errors.ERRORS` by `scripts/gen_docs.py`.

`--check` regenerates into a temporary folder and fails when a checked-in generated file differs, is missing
or is left over from a proto that no longer exists: CI catches a proto edited without regenerating.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_DIR = ROOT  # protos/llmsched/v1/x.proto -> llmsched/v1/x_pb2.py
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _generate(out_dir: Path) -> None:
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    bin_dir = Path(sys.executable).parent
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    _drop_empty_grpc_modules(out_dir, protos)


def _drop_empty_grpc_modules(out_dir: Path, protos: list[str]) -> None:
    """Remove the *_pb2_grpc modules protoc writes for protos that declare no service: they hold nothing."""
    for proto in protos:
        if "\nservice " in "\n" + (PROTO_ROOT / proto).read_text():
            continue
        stem = out_dir / proto.removesuffix(".proto")
        for suffix in ("_pb2_grpc.py", "_pb2_grpc.pyi"):
            Path(f"{stem}{suffix}").unlink(missing_ok=True)


def _generated(root: Path) -> set[Path]:
    """The generated files under root/llmsched, relative to root."""
    package = root / "llmsched"
    if not package.exists():
        return set()
    return {p.relative_to(root) for p in package.rglob("*") if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)}


def _differences(fresh: Path, tree: Path) -> list[str]:
    names_fresh, names_tree = _generated(fresh), _generated(tree)
    diffs = sorted(f"{n} (missing)" for n in names_fresh - names_tree)
    diffs += sorted(f"{n} (no proto makes it)" for n in names_tree - names_fresh)
    diffs += sorted(str(n) for n in names_fresh & names_tree if not filecmp.cmp(fresh / n, tree / n, shallow=False))
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the checked-in generated code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        _generate(fresh)
        if args.check:
            diffs = _differences(fresh, OUT_DIR)
            if diffs:
                print("generated code is stale; run `make protos`:", *diffs, sep="\n  ")
                raise SystemExit(1)
            print("generated code is up to date")
            return
        for stale in _generated(OUT_DIR) - _generated(fresh):
            (OUT_DIR / stale).unlink()
        for name in _generated(fresh):
            (OUT_DIR / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fresh / name, OUT_DIR / name)
        print("generated into llmsched/")


if __name__ == "__main__":
    main()
