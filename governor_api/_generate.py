"""Regenerates the committed gRPC stubs in `governor_api/` from `proto/` (grpcio-tools).

`make proto` runs `python -m governor_api._generate`; `--check` exits 1 when the
committed stubs differ from what the current `.proto` sources generate (the test suite
runs the same comparison).

Why the staging step: protoc names a generated module after the `.proto` path relative
to the include root, and writes imports between generated modules from that path. The
sources live at `proto/governor/v1/governor.proto` and
`proto/externalscaler/externalscaler.proto`; they are copied to
`<tmp>/governor_api/governor_v1.proto` and `<tmp>/governor_api/externalscaler.proto`
before compiling, so the stubs are the modules `governor_api.governor_v1_pb2` (and
`_pb2_grpc`) and import each other as `from governor_api import ...`. (`proto` itself is
never an importable package: the name belongs to the proto-plus library.)
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "governor_api"
# source under proto/ -> staged file name inside the package
SOURCES: dict[str, str] = {
    "governor/v1/governor.proto": "governor_v1.proto",
    "externalscaler/externalscaler.proto": "externalscaler.proto",
}


def generated_names() -> list[str]:
    """File names (inside `governor_api/`) the generator writes."""
    names = []
    for staged in SOURCES.values():
        stem = staged.removesuffix(".proto")
        names += [f"{stem}_pb2.py", f"{stem}_pb2_grpc.py"]
    return names


def generate(out_dir: Path, proto_root: Path | None = None) -> list[Path]:
    """Compile every source into `out_dir` (a directory standing for `governor_api/`).

    Returns the written files. Raises RuntimeError with protoc's exit status on failure.
    """
    from importlib.resources import files

    from grpc_tools import protoc

    src_root = proto_root or ROOT / "proto"
    with tempfile.TemporaryDirectory(prefix="governor-proto-") as tmp:
        stage = Path(tmp) / "src"
        pkg = stage / PACKAGE
        pkg.mkdir(parents=True)
        for src, staged in SOURCES.items():
            shutil.copyfile(src_root / src, pkg / staged)
        build = Path(tmp) / "out"
        build.mkdir()
        well_known = str(files("grpc_tools") / "_proto")
        args = [
            "grpc_tools.protoc",
            f"-I{stage}",
            f"-I{well_known}",
            f"--python_out={build}",
            f"--grpc_python_out={build}",
            *(f"{PACKAGE}/{staged}" for staged in SOURCES.values()),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit status {rc}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in generated_names():
            target = out_dir / name
            shutil.copyfile(build / PACKAGE / name, target)
            written.append(target)
        return written


def stale_files(package_dir: Path | None = None) -> list[str]:
    """Names of committed stubs that differ from freshly generated ones (or are missing)."""
    committed = package_dir or ROOT / PACKAGE
    with tempfile.TemporaryDirectory(prefix="governor-proto-check-") as tmp:
        fresh_dir = Path(tmp)
        generate(fresh_dir)
        stale = []
        for name in generated_names():
            have = committed / name
            if not have.exists() or have.read_bytes() != (fresh_dir / name).read_bytes():
                stale.append(name)
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print(f"stale gRPC stubs (run `make proto`): {', '.join(stale)}", file=sys.stderr)
            return 1
        print("gRPC stubs are up to date")
        return 0
    for path in generate(ROOT / PACKAGE):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
