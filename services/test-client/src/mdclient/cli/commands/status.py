"""`mdclient status ID`: a history request's outcome. An outcome comes from Iceberg
alone (works while the relay is down); without one, the relays tell PENDING
(accepted, running) from UNKNOWN (none remembers it)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mdclient import timeparse
from mdclient.cli.args import UsageError, describe, settings_from_args
from mdclient.cli.commands import Subparsers, open_client
from mdclient.cli.output import integrity_line
from mdclient.exit_codes import ExitCode
from mdproto import topics

if TYPE_CHECKING:
    from rich.console import Console

#: A recorded outcome's exit code; any other state (ERROR) exits FAILED.
_OUTCOMES = {"OK": ExitCode.OK, "NOT_FOUND": ExitCode.NOT_FOUND}


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    status = sub.add_parser(
        "status",
        parents=[common],
        help="a history request's outcome from the requests table (needs no relay)",
    )
    status.add_argument("request_id", help="the request_id the submit was acknowledged with")


def run(args: argparse.Namespace, err: Console) -> int:
    from mdclient.frames import IcebergReader
    from mdclient.request_status import status_from_row

    if not topics.is_valid_id(args.request_id):
        raise UsageError(f"{args.request_id!r}: a request_id is 1-128 characters of [A-Za-z0-9_.-]")
    settings = settings_from_args(args)
    reader = IcebergReader(settings.catalog_properties(), catalog_name=settings.catalog_name)
    status = status_from_row(
        args.request_id, reader.read_request(settings.requests_table, args.request_id)
    )
    if status is None:
        with open_client(settings) as client:
            status = client.status(args.request_id)
    note = status.notification
    if note is None:
        table = settings.requests_table
        if status.state == "PENDING":
            since = timeparse.format_ms(status.accepted_at_ms)
            print(f"{args.request_id}: PENDING (accepted {since}; no outcome in {table} yet)")
            return ExitCode.PENDING
        print(
            f"{args.request_id}: UNKNOWN (no outcome in {table}, and no relay remembers "
            f"accepting it: never submitted, refused, or accepted more than "
            f"{status.remembered_s} s ago or before a relay restart)"
        )
        return ExitCode.UNKNOWN
    period = note.bars or note.period_seconds
    where = describe(note.ticker, period, note.start_time_ms, note.end_time_ms)
    reason = f", {note.error_code or 'error'}: {note.reason}" if status.state == "ERROR" else ""
    snapshot = f", {note.iceberg_table} snapshot {note.snapshot_id}" if note.snapshot_id else ""
    done = timeparse.format_ms(note.completed_at_ms) if note.completed_at_ms else "?"
    print(
        f"{note.request_id}: {status.state}, {note.row_count} rows, {where}{snapshot}"
        f"{reason}, completed {done}"
    )
    integrity = integrity_line(note)
    if integrity is not None:
        print(f"integrity: {integrity}")
    return _OUTCOMES.get(status.state, ExitCode.FAILED)
