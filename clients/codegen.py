"""Regenerates the committed client stubs from proto/.

Python: grpcio-tools (``_pb2.py``, ``_pb2.pyi``, ``_pb2_grpc.py``) plus mypy-protobuf's
typed ``_pb2_grpc.pyi``. TypeScript: ``buf generate`` with the ts-proto plugin installed in
clients/node. ``--out DIR`` writes both trees under DIR instead of the repository, which is
how the test suite checks that the committed code is up to date.

Usage: python clients/codegen.py [--out DIR] [--python-only]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "proto"
NODE_BIN = REPO / "clients" / "node" / "node_modules" / ".bin"
PYTHON_PACKAGES = ("mnemo",)  # top-level package(s) the protos generate into


def proto_files() -> list[str]:
    return sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))


def _plugin(name: str) -> str:
    """Path of a protoc plugin installed beside this interpreter."""
    scripts = Path(sysconfig.get_path("scripts"))
    candidate = scripts / name
    found = candidate if candidate.exists() else shutil.which(name)
    if not found:
        sys.exit(f"codegen: {name} not found (pip install mypy-protobuf)")
    return str(found)


def generate_python(out_root: Path) -> None:
    import grpc_tools  # imported here so --help works without it

    out_root.mkdir(parents=True, exist_ok=True)
    for pkg in PYTHON_PACKAGES:
        shutil.rmtree(out_root / pkg, ignore_errors=True)
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{wkt}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--mypy_grpc_out={out_root}",
        *proto_files(),
    ]
    subprocess.run(cmd, check=True, cwd=REPO)
    # Make every generated directory a regular package so setuptools and mypy find it.
    for pkg in PYTHON_PACKAGES:
        for d in [out_root / pkg, *(p for p in (out_root / pkg).rglob("*") if p.is_dir())]:
            if d.name != "__pycache__":
                (d / "__init__.py").touch()


def generate_typescript(out_root: Path | None) -> None:
    buf = NODE_BIN / "buf"
    if not buf.exists():
        sys.exit("codegen: clients/node/node_modules is missing; run `npm ci` in clients/node")
    target = REPO / "clients" / "node" / "src" / "gen"
    out = [] if out_root is None else ["-o", str(out_root)]
    if out_root is None:
        shutil.rmtree(target, ignore_errors=True)
    subprocess.run([str(buf), "generate", *out], check=True, cwd=REPO)
    # google.rpc's Status, ErrorInfo and BadRequest, which carry a refusal's reason and
    # fields in the grpc-status-details-bin trailer (clients/node/src/errors.ts decodes
    # them), from googleapis-common-protos' .proto files (a dependency of the server's).
    googleapis = _googleapis_protos()
    names = ("status.proto", "error_details.proto")
    rpc = [f"--path={googleapis / 'google' / 'rpc' / name}" for name in names]
    subprocess.run([str(buf), "generate", str(googleapis), *rpc, *out], check=True, cwd=REPO)


def _googleapis_protos() -> Path:
    import google.rpc  # googleapis-common-protos

    return Path(next(iter(google.rpc.__path__))).parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write under this directory instead of the repository")
    ap.add_argument("--python-only", action="store_true")
    args = ap.parse_args(argv)
    py_root = (args.out / "clients" / "python") if args.out else REPO / "clients" / "python"
    generate_python(py_root)
    if not args.python_only:
        generate_typescript(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
