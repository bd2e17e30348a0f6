"""Resolve the pinned JVM artifacts once into a local cache, then reuse it offline.

``python -m infra.artifacts`` (what ``make jars`` runs) calls Maven once for the
components that are missing; every later call finds a marker file whose
fingerprint matches the poms and touches neither Maven nor the network.

Cache layout (``$INFRA_CACHE_DIR``, default ``.cache/`` at the repository root)::

    kafka/          runtime classpath of the Kafka broker
    iceberg-rest/   the Iceberg REST catalog server jar and the PostgreSQL JDBC driver,
                    plus classes-<hash>/ (infra/catalog/CatalogServer.java, compiled)
    spark/          jars for spark.jars: Kafka source + Iceberg runtime + AWS bundle
    spark-cds/      Spark drivers' class-data-sharing archive (infra/spark_class_archive.py)
    <dir>/.resolved.json   marker: pom fingerprint + the jar list
    maven.log       output of the last Maven run
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.versions import MAVEN_DIR, load_versions

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPONENTS: tuple[str, ...] = ("kafka", "iceberg-rest", "spark")
MARKER = ".resolved.json"
CACHE_ENV = "INFRA_CACHE_DIR"
MAVEN_REPO_ENV = "INFRA_MAVEN_REPO"
MAVEN_SETTINGS_ENV = "INFRA_MAVEN_SETTINGS"

Log = Callable[[str], None]


class ArtifactError(RuntimeError):
    """Maven could not resolve the artifacts, or the cache is incomplete."""


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """The artifact cache: ``$INFRA_CACHE_DIR`` or ``.cache/`` at the repository root."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser().resolve() if env else REPO_ROOT / ".cache"


def fingerprint() -> str:
    """Hash of every Maven input file: a version bump invalidates the cache."""
    h = hashlib.sha256()
    for path in sorted(MAVEN_DIR.rglob("*.xml")):
        h.update(path.relative_to(MAVEN_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class ResolvedComponent:
    """One resolved cache directory and the jars Maven put there."""

    name: str
    directory: Path
    jars: tuple[Path, ...]


def _read_marker(directory: Path, expected: str) -> ResolvedComponent | None:
    marker = directory / MARKER
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if data.get("fingerprint") != expected:
        return None
    jars = tuple(directory / name for name in data.get("jars", []))
    if not jars or not all(j.is_file() for j in jars):
        return None
    return ResolvedComponent(directory.name, directory, jars)


def _write_marker(directory: Path, fp: str) -> ResolvedComponent:
    jars = sorted(p for p in directory.glob("*.jar") if p.is_file())
    if not jars:
        raise ArtifactError(f"Maven put no jars into {directory}")
    versions = load_versions()
    payload = {
        "fingerprint": fp,
        "coordinates": versions.coordinates.get(directory.name, []),
        "jars": [j.name for j in jars],
    }
    tmp = directory / (MARKER + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(directory / MARKER)
    return ResolvedComponent(directory.name, directory, tuple(jars))


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """Serialise resolutions: several engineers' test runs may share one cache."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".resolve.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _mvn_command(cache: Path, modules: Sequence[str], offline: bool) -> list[str]:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ArtifactError("`mvn` is not on PATH: install Maven 3.8+ to resolve the jars")
    settings = os.environ.get(MAVEN_SETTINGS_ENV) or str(MAVEN_DIR / "settings.xml")
    cmd = [
        mvn,
        "-B",
        "-s",
        settings,
        "-f",
        str(MAVEN_DIR / "pom.xml"),
        "-pl",
        ",".join(modules),
        f"-Dinfra.cache.dir={cache}",
    ]
    repo = os.environ.get(MAVEN_REPO_ENV)
    if repo:
        cmd.append(f"-Dmaven.repo.local={repo}")
    if offline:
        cmd.append("-o")
    cmd.append("dependency:copy-dependencies")
    return cmd


def _is_progress_line(line: str) -> bool:
    """Jar downloads, module starts, errors and the result; not the ~300 pom downloads."""
    if line.startswith("Downloaded from"):
        return ".jar (" in line
    return line.startswith(("[ERROR]", "BUILD ", "Building "))


def _run_maven(cache: Path, modules: Sequence[str], offline: bool, log: Log) -> None:
    cmd = _mvn_command(cache, modules, offline)
    log_path = cache / "maven.log"
    log(f"[artifacts] running Maven for {', '.join(modules)} (full output: {log_path})")
    with log_path.open("w") as out:
        out.write(" ".join(cmd) + "\n")
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=MAVEN_DIR,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            stripped = line.rstrip()
            if _is_progress_line(stripped.removeprefix("[INFO] ")):
                log(f"[artifacts]   {stripped.removeprefix('[INFO] ')}")
        rc = proc.wait()
    if rc != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-25:])
        raise ArtifactError(f"Maven failed (exit {rc}); see {log_path}\n{tail}")


def ensure_artifacts(
    components: Sequence[str] = COMPONENTS,
    *,
    cache: Path | None = None,
    offline: bool = False,
    log: Log = _stderr,
) -> dict[str, ResolvedComponent]:
    """Return the resolved components, running Maven only for missing/stale ones."""
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown artifact components: {sorted(unknown)}")
    cache = cache or cache_dir()
    fp = fingerprint()
    found = {c: _read_marker(cache / c, fp) for c in components}
    if all(found.values()):
        return {c: r for c, r in found.items() if r is not None}
    with _locked(cache):
        # Another process may have resolved while we waited for the lock.
        found = {c: _read_marker(cache / c, fp) for c in components}
        missing = [c for c, r in found.items() if r is None]
        if missing:
            for c in missing:
                shutil.rmtree(cache / c, ignore_errors=True)
            _run_maven(cache, missing, offline, log)
            for c in missing:
                found[c] = _write_marker(cache / c, fp)
    result = {c: r for c, r in found.items() if r is not None}
    if len(result) != len(components):
        raise ArtifactError(f"artifact cache {cache} is incomplete after resolution")
    return result


def spark_jars(cache: Path | None = None) -> list[Path]:
    """Jars to hand to Spark as ``spark.jars`` (Kafka source, Iceberg runtime, AWS bundle)."""
    return list(ensure_artifacts(("spark",), cache=cache)["spark"].jars)


def kafka_classpath(cache: Path | None = None) -> list[Path]:
    """Runtime classpath of the Kafka broker (``kafka.Kafka``)."""
    return list(ensure_artifacts(("kafka",), cache=cache)["kafka"].jars)


#: The catalog server's launcher (loopback bind, client defaults), compiled on first use.
CATALOG_SERVER_SOURCE = REPO_ROOT / "infra" / "catalog" / "CatalogServer.java"
CATALOG_SERVER_MAIN = "org.apache.iceberg.rest.CatalogServer"


def catalog_server_classpath(cache: Path | None = None) -> list[Path]:
    """Classpath of the Iceberg REST catalog server (run ``CATALOG_SERVER_MAIN``).

    Iceberg's REST server jar and the PostgreSQL driver from Maven, plus our
    launcher compiled with ``javac`` into a folder named after its source's hash,
    so an edited launcher is rebuilt and an unchanged one never is.
    """
    resolved = ensure_artifacts(("iceberg-rest",), cache=cache)["iceberg-rest"]
    source = CATALOG_SERVER_SOURCE.read_bytes()
    classes = resolved.directory / f"classes-{hashlib.sha256(source).hexdigest()[:12]}"
    if not (classes / "org" / "apache" / "iceberg" / "rest" / "CatalogServer.class").is_file():
        javac = shutil.which("javac")
        if javac is None:
            raise ArtifactError("`javac` is not on PATH: install a JDK 17 (not only a JRE)")
        tmp = classes.with_name(classes.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        cp = os.pathsep.join(str(j) for j in resolved.jars)
        proc = subprocess.run(
            [javac, "-d", str(tmp), "-cp", cp, str(CATALOG_SERVER_SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ArtifactError(f"javac {CATALOG_SERVER_SOURCE.name} failed:\n{proc.stderr}")
        shutil.rmtree(classes, ignore_errors=True)
        tmp.replace(classes)
    return [classes, *resolved.jars]


def _size_mib(paths: Sequence[Path]) -> float:
    return sum(p.stat().st_size for p in paths) / 2**20


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: resolve (or verify) every component and print where it lives."""
    parser = argparse.ArgumentParser(prog="python -m infra.artifacts", description=__doc__)
    parser.add_argument("--cache-dir", type=Path, help=f"default: ${CACHE_ENV} or .cache/")
    parser.add_argument("--offline", action="store_true", help="run Maven with -o")
    parser.add_argument(
        "components", nargs="*", help=f"any of {', '.join(COMPONENTS)} (default: all)"
    )
    args = parser.parse_args(argv)
    bad = sorted(set(args.components) - set(COMPONENTS))
    if bad:
        parser.error(f"unknown components {bad}; choose from {', '.join(COMPONENTS)}")
    cache = args.cache_dir.resolve() if args.cache_dir else cache_dir()
    components = tuple(args.components) or COMPONENTS
    try:
        resolved = ensure_artifacts(components, cache=cache, offline=args.offline)
        if "iceberg-rest" in resolved:
            catalog_server_classpath(cache)
    except ArtifactError as exc:
        _stderr(f"[artifacts] ERROR: {exc}")
        return 1
    if "spark" in resolved:
        from infra import spark_class_archive

        try:
            archive = spark_class_archive.ensure_archive(_stderr, cache)
            print(f"[artifacts] spark-cds     {archive.stat().st_size / 2**20:7.1f} MiB  {archive}")
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            # Only start-up speed depends on it: say so and go on without it.
            _stderr(f"[artifacts] WARNING: no class archive for Spark drivers ({exc})")
    versions = load_versions()
    for name, comp in resolved.items():
        print(
            f"[artifacts] {name:<13} {len(comp.jars):>3} jars {_size_mib(comp.jars):7.1f} MiB"
            f"  {comp.directory}  ({'; '.join(versions.coordinates[name])})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
