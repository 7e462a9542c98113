"""Regenerates the committed gRPC stubs in `governor_api/` from `proto/` (grpcio-tools).

`make proto` runs `python -m governor_api._generate`; `--check` exits 1 when the
committed stubs differ from what the current `.proto` sources generate (the test suite
runs the same comparison). The check compares the compiled descriptors (messages,
fields, numbers, services: what matters on the wire) always, and the generated files
byte for byte when the installed grpcio-tools is the version that generated them (other
versions write other version stamps and helper code).

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
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

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


def generate(
    out_dir: Path, proto_root: Path | None = None, descriptor_set: Path | None = None
) -> list[Path]:
    """Compile every source into `out_dir` (a directory standing for `governor_api/`),
    and, if asked, their FileDescriptorSet into `descriptor_set`.

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
            *([f"--descriptor_set_out={descriptor_set}"] if descriptor_set else []),
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


def _generated_version(path: Path) -> str | None:
    """The grpcio-tools version stamped in a committed `_pb2_grpc.py`, if any."""
    if not path.exists():
        return None
    m = re.search(r"^GRPC_GENERATED_VERSION = '([^']+)'", path.read_text(), re.MULTILINE)
    return m.group(1) if m else None


def _normalized(fdp: Any) -> Any:
    """A FileDescriptorProto without json_name (protoc's descriptor sets fill it in,
    the embedded descriptors of generated modules do not)."""
    out = type(fdp)()
    out.CopyFrom(fdp)

    def strip(messages: Any) -> None:
        for m in messages:
            for f in m.field:
                f.ClearField("json_name")
            strip(m.nested_type)

    strip(out.message_type)
    return out


def stale_files(package_dir: Path | None = None, proto_root: Path | None = None) -> list[str]:
    """Names of committed stubs that differ from what the sources generate (see module
    doc): a descriptor difference always counts; a byte difference counts when the
    installed grpcio-tools is the one that generated the committed files."""
    import importlib

    from google.protobuf import descriptor_pb2
    from grpc_tools import grpc_version

    committed = package_dir or ROOT / PACKAGE
    stale: list[str] = []
    with tempfile.TemporaryDirectory(prefix="governor-proto-check-") as tmp:
        fresh_dir = Path(tmp) / "out"
        desc_path = Path(tmp) / "set.pb"
        generate(fresh_dir, proto_root, desc_path)
        fresh = descriptor_pb2.FileDescriptorSet.FromString(desc_path.read_bytes())
        by_name = {f.name: f for f in fresh.file}
        for staged in SOURCES.values():
            stem = staged.removesuffix(".proto")
            module_name = f"{stem}_pb2"
            if not (committed / f"{module_name}.py").exists():
                stale.append(f"{module_name}.py")
                continue
            if package_dir is None:
                module = importlib.import_module(f"{PACKAGE}.{module_name}")
                have = descriptor_pb2.FileDescriptorProto.FromString(
                    module.DESCRIPTOR.serialized_pb
                )
                want = by_name.get(f"{PACKAGE}/{staged}")
                if want is None or _normalized(have) != _normalized(want):
                    stale.append(f"{module_name}.py")
        same_tools = all(
            _generated_version(committed / name) in (None, grpc_version.VERSION)
            for name in generated_names()
            if name.endswith("_grpc.py")
        )
        if same_tools:
            for name in generated_names():
                have_path = committed / name
                same = have_path.exists() and (
                    have_path.read_bytes() == (fresh_dir / name).read_bytes()
                )
                if not same and name not in stale:
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
