"""Generate the typed Python gRPC code for protos/ into scheduler_svc/_proto/.

This is the only way generated code enters the tree. `--check` regenerates into a temporary folder and
fails when the checked-in files differ, so CI catches a proto edited without regenerating.

grpcio-tools emits absolute imports that mirror the proto package (`from llmsched.v1 import ...`); they
are rewritten to live under `scheduler_svc._proto` so no extra top-level package is needed.
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
OUT_PACKAGE = "scheduler_svc._proto"
OUT_DIR = ROOT / "scheduler_svc" / "_proto"


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
    for path in out_dir.rglob("*.py*"):
        text = path.read_text()
        text = text.replace("from llmsched.", f"from {OUT_PACKAGE}.llmsched.")
        text = text.replace("import llmsched.", f"import {OUT_PACKAGE}.llmsched.")
        path.write_text(text)
    for package_dir in [out_dir, *(p for p in out_dir.rglob("*") if p.is_dir())]:
        (package_dir / "__init__.py").touch()


def _differences(a: Path, b: Path) -> list[str]:
    names_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    names_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    diffs = sorted(str(n) for n in names_a ^ names_b)
    diffs += sorted(str(n) for n in names_a & names_b if not filecmp.cmp(a / n, b / n, shallow=False))
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the checked-in code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "_proto"
        fresh.mkdir()
        _generate(fresh)
        if args.check:
            diffs = _differences(fresh, OUT_DIR) if OUT_DIR.exists() else ["(missing)"]
            if diffs:
                print("generated code is stale; run `make protos`:", *diffs, sep="\n  ")
                raise SystemExit(1)
            print("generated code is up to date")
            return
        shutil.rmtree(OUT_DIR, ignore_errors=True)
        shutil.copytree(fresh, OUT_DIR)
        print(f"generated into {OUT_DIR.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
