"""Generate the Python message classes and type stubs from proto/*.proto.

Run by `make proto`; the output in src/mdproto/gen/ is not committed, so the
generated code always matches the pinned protoc (grpcio-tools) and protobuf.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
OUT = HERE / "src" / "mdproto" / "gen"


def main() -> int:
    sources = sorted(str(p.name) for p in HERE.glob("*.proto"))
    args = [
        "protoc",
        f"-I{HERE}",
        # protoc looks plugins up on PATH; the venv's bin may not be on it.
        f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}",
        f"--python_out={OUT}",
        f"--mypy_out={OUT}",
        *sources,
    ]
    code: int = protoc.main(args)
    if code != 0:
        print(f"protoc failed with exit code {code}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
