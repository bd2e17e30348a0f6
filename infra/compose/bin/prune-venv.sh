#!/bin/sh
# Remove from a service venv what the service never imports or runs (builder
# stages only, before the venv is copied into the final image; docs/docker.md,
# "Image sizes"):
# - third-party test suites;
# - pyarrow's build-time files (C++ headers and sources, Cython declarations, the
#   link-time copies of libarrow_python) and Arrow Flight (~33 MB: nothing imports
#   pyarrow.flight, and no other library links libarrow_flight);
# - the symbol tables of compiled extensions (`strip --strip-unneeded`, when
#   binutils is there: ~75 MB in the ingestor; the dynamic symbols stay);
# - the top-level packages named after the venv: dependencies of a dependency that
#   this service never imports (checked by tracing its imports: docs/docker.md).
# Then it proves that what stays imports.
#
#   prune-venv.sh /opt/venv [TOP_LEVEL_PACKAGE...]
set -eu
venv=${1:?usage: prune-venv.sh VENV [TOP_LEVEL_PACKAGE...]}
shift
site=$(echo "$venv"/lib/python3*/site-packages)
[ -d "$site" ] || { echo "prune-venv: no site-packages under $venv" >&2; exit 2; }

find "$site" -depth -type d \( -name tests -o -path '*/ccxt/test' \) -exec rm -rf {} +

arrow=$site/pyarrow
if [ -d "$arrow" ]; then
    rm -rf "$arrow/include" "$arrow/includes" "$arrow/src" \
        "$arrow"/*.pyx "$arrow"/*.pxd "$arrow"/*.pxi \
        "$arrow"/_flight.* "$arrow"/libarrow_flight.so* "$arrow"/libarrow_python_flight.so* \
        "$arrow"/_pyarrow_cpp_tests.*
    # The extension modules load libX.so.NNNN; the unversioned and full-version
    # names are copies for linking C++ extensions against pyarrow.
    for lib in "$arrow"/libarrow_python*.so; do
        rm -f "$lib" "$lib".*.*.*
    done
fi

for package in "$@"; do
    [ -e "$site/$package" ] || { echo "prune-venv: no package $package in $site" >&2; exit 2; }
    rm -rf "${site:?}/$package"
done

# Not the libraries auditwheel vendored (*.libs/): patchelf rewrote them, and strip
# breaks those ("ELF load command address/offset not page-aligned": numpy's OpenBLAS).
if command -v strip >/dev/null; then
    find "$site" -path '*.libs/*' -prune -o -type f -name '*.so*' -exec strip --strip-unneeded {} +
fi

# Every compiled extension still loads: a library stripped wrongly or removed while
# linked fails here ("cannot open shared object file", "undefined symbol", "ELF
# ..."), as does one that imports a dropped package. Other import errors are the
# environment's, not this script's: an optional dependency never installed
# (zstandard's cffi backend) or a GUI toolkit absent (matplotlib's Tk backend).
"$venv/bin/python" - "$site" "$@" <<'PY'
import importlib, pathlib, sys

site, dropped = pathlib.Path(sys.argv[1]), set(sys.argv[2:])
extensions = sorted(site.rglob("*.cpython-*.so"))
failed = []
for path in extensions:
    module = ".".join(path.relative_to(site).with_suffix("").with_suffix("").parts)
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in dropped:
            failed.append(f"{module} imports the dropped {exc.name}")
    except ImportError as exc:
        if any(sign in str(exc) for sign in ("shared object", "symbol", "ELF", "file too short")):
            failed.append(f"{module}: {exc}")
print(f"prune-venv: {len(extensions)} extensions load")
sys.exit("\n".join(failed) or None)
PY
