"""``spark-pipeline`` / ``python -m pipeline``: run the pipeline, or print a spark-submit line.

    spark-pipeline [run] [--config config.yaml]
    spark-pipeline submit-args [--config config.yaml]   # --jars/--conf for spark-submit

Under spark-submit this file is the application: ``spark-submit --master
spark://host:7077 $(spark-pipeline submit-args) src/pipeline/__main__.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline.config import load_settings
from pipeline.preflight import StartupError
from pipeline.session import SessionConfigError, resolve_jars, spark_conf

log = logging.getLogger("pipeline")


def _configure_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # pyiceberg names the FileIO it loads at INFO, on every table load with a py-io-impl
    # (arrow_appends.FILE_IO): several lines a second.
    logging.getLogger("pyiceberg.io").setLevel(logging.WARNING)


def _submit_args(config: str | None) -> str:
    settings = load_settings(config)
    args = ["--jars", ",".join(resolve_jars(settings))]
    args += ["--driver-memory", settings.spark.driver_memory]
    for key, value in spark_conf(settings, include_launch=False).items():
        args += ["--conf", f"{key}={value}"]
    return shlex.join(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark-pipeline", description=__doc__)
    parser.add_argument("command", nargs="?", default="run", choices=["run", "submit-args"])
    parser.add_argument("--config", help="YAML config (default: $CONFIG_PATH, else built-ins)")
    args = parser.parse_args(argv)
    _configure_logging()
    if args.command == "submit-args":
        print(_submit_args(args.config))
        return 0

    from pipeline.app import run
    from pipeline.engine import stop_on_signals

    stop = stop_on_signals(log)
    try:
        settings = load_settings(args.config)
        return run(settings, stop)
    except (StartupError, SessionConfigError, FileNotFoundError) as exc:
        log.error("cannot start: %s", exc)
        return 2


if __name__ == "__main__":
    # Run as a file (spark-submit): make `pipeline` importable from the source tree.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())
