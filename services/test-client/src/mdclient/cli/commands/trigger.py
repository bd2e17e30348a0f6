"""`mdclient trigger add|cancel|list|watch`: CEP triggers from the command line.

    add     parse conditions -> Client.register_trigger (subscribe, REGISTER, ack)
            -> print the trigger id and event topic; --watch: print events until final
    cancel  CANCEL per id -> ack
    list    LIST for the client id -> one line per trigger
    watch   subscribe RESPONSE:{client_id} (+ CEP:{id} per id) -> print events like `live`

`list`, `cancel` and `watch` of triggers added earlier need the same client id
as the `add` (`--client-id` or MDCLIENT_CLIENT_ID): the default is random per run.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from mdclient import timeparse
from mdclient.cli.args import settings_from_args
from mdclient.cli.commands import Subparsers, open_client
from mdclient.cli.views import until
from mdclient.errors import InvalidRequest
from mdclient.exit_codes import ExitCode
from mdproto.error_codes import BAD_TIME

if TYPE_CHECKING:
    from rich.console import Console

    from mdclient.client import Client
    from mdclient.triggers import TriggerEvents


class _UsageError(InvalidRequest):
    """Bad command-line input (exit 2, like every InvalidRequest)."""


def add_parser(sub: Subparsers[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    trigger = sub.add_parser("trigger", help="register, cancel, list and watch CEP triggers")
    actions = trigger.add_subparsers(dest="trigger_command", required=True, metavar="ACTION")

    watching = argparse.ArgumentParser(add_help=False)
    watching.add_argument("--count", type=int, help="stop after N events (exit 0)")
    watching.add_argument("--duration", type=float, help="stop after N seconds (exit 0)")

    add = actions.add_parser(
        "add",
        parents=[common, watching],
        help="register a trigger",
        description="Conditions are KIND:THRESHOLD[@WINDOW]: above:100, below:95, pct:5@60s, "
        "volume:1000@5m; two conditions are a sequence (the second within --within).",
    )
    add.add_argument("ticker", help="EXCHANGE:BASE/QUOTE")
    add.add_argument("conditions", nargs="+", metavar="CONDITION", help="one, or two in sequence")
    add.add_argument("--id", dest="trigger_id", help="trigger id (default: random)")
    add.add_argument(
        "--period", default="0", help="evaluate closed candles of this period (default 0: ticks)"
    )
    add.add_argument("--within", help="sequence: second condition at most this long after (60s)")
    add.add_argument("--repeating", action="store_true", help="fire on every match, not once")
    add.add_argument("--expires", help="+10m, 2026-11-21T18:00Z, epoch ms (default: never)")
    add.add_argument(
        "--per-trigger",
        action="store_true",
        help="events on CEP:{trigger_id} instead of RESPONSE:{client_id}",
    )
    add.add_argument("--watch", action="store_true", help="then print its events until final")

    cancel = actions.add_parser("cancel", parents=[common], help="cancel triggers by id")
    cancel.add_argument("trigger_ids", nargs="+", metavar="TRIGGER_ID")

    actions.add_parser("list", parents=[common], help="this client id's registered triggers")

    watch = actions.add_parser(
        "watch", parents=[common, watching], help="print trigger events as they arrive"
    )
    watch.add_argument(
        "trigger_ids",
        nargs="*",
        metavar="TRIGGER_ID",
        help="only these (also per-trigger topics); default: every trigger of the client id",
    )


def run(args: argparse.Namespace, err: Console) -> int:
    with open_client(settings_from_args(args)) as client:
        return _run(args, err, client)


def _run(args: argparse.Namespace, err: Console, client: Client) -> int:
    command = args.trigger_command
    if command == "add":
        return _add(args, err, client)
    if command == "cancel":
        for trigger_id in args.trigger_ids:
            client.cancel_trigger(trigger_id)
            err.print(f"cancelled {trigger_id}", highlight=False)
        return ExitCode.OK
    if command == "list":
        return _list(client)
    ids = list(args.trigger_ids) or None
    with client.trigger_events(ids, until_final=ids is not None) as events:
        if not args.quiet:
            err.print(f"watching {', '.join(events.topics)} (Ctrl-C to stop)", highlight=False)
        _print_events(events, args.count, args.duration)
    return ExitCode.OK


def _add(args: argparse.Namespace, err: Console, client: Client) -> int:
    from mdclient.triggers import parse_condition

    now_ms = int(time.time() * 1000)
    try:
        period = 0 if args.period in ("0", "ticks") else timeparse.parse_period(args.period)
        within = timeparse.parse_period(args.within) if args.within else 0
        expires = timeparse.parse_time(args.expires, now_ms=now_ms) if args.expires else 0
    except timeparse.TimeFormatError as exc:
        raise _UsageError(str(exc), error_code=BAD_TIME) from None
    conditions = [parse_condition(text) for text in args.conditions]
    events = client.register_trigger(
        args.ticker.strip().upper(),
        conditions,
        trigger_id=args.trigger_id,
        period=period,
        within=within,
        repeating=args.repeating,
        expires=expires,
        per_trigger=args.per_trigger,
    )
    with events:
        err.print(f"registered {events.trigger_id}: events on {events.topics[0]}", highlight=False)
        if not args.watch:
            from rich.console import Console

            Console(highlight=False).print(events.trigger_id, markup=False)
            return ExitCode.OK
        _print_events(events, args.count, args.duration)
    return ExitCode.OK


def _list(client: Client) -> int:
    from rich.console import Console

    from mdclient.triggers import describe_trigger

    out = Console(highlight=False, soft_wrap=True)
    triggers = client.list_triggers()
    for request in triggers:
        out.print(describe_trigger(request), markup=False)
    if not triggers:
        Console(stderr=True).print(f"no triggers registered for client id {client.client_id}")
    return ExitCode.OK


def _print_events(events: TriggerEvents, count: int | None, duration: float | None) -> None:
    from rich.console import Console

    from mdclient.triggers import event_line

    out = Console(highlight=False, soft_wrap=True)
    for event in until(events, count, duration, ended=lambda: events.closed or events.finished):
        out.print(event_line(event), markup=False)
