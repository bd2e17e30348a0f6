"""Legacy synchronous flow: `DataRequest{legacy_sync}` -> inline `DataResponse`.

The candles travel in the response, sent through a DEALER to the relay's
ROUTER :5556 (`work.LegacyResponder`), not through Kafka; history.py's
`HistoryJobs` claims the request and sends the answer. `limit` caps the
candles (the first `limit` from the start of the range); 0 means no limit,
bounded by `history.legacy_max_candles` so a response stays a sane size. A
range with more candles than that bound is an ERROR (`too_many_candles`), never
a silently shortened answer.
"""

from __future__ import annotations

import logging

from ingestor.candles import ohlc_row
from ingestor.errors import RequestFailedError
from ingestor.exchange_calls import FetchEnv
from ingestor.pages import CandleSource, iter_pages, plan_request
from mdproto.error_codes import INTERNAL, TOO_MANY_CANDLES
from mdproto.messages import DataRequest, DataResponse, Status

log = logging.getLogger(__name__)


async def legacy_response(
    request: DataRequest,
    source: CandleSource | None,
    env: FetchEnv,
    *,
    ingestor_id: str,
    max_candles: int,
) -> DataResponse:
    response = DataResponse(
        request_id=request.request_id,
        ticker=request.ticker,
        period_seconds=request.period_seconds,
        ingestor_id=ingestor_id,
    )
    cap = min(request.limit, max_candles) if request.limit else max_candles
    truncated = False
    try:
        symbol, plan = plan_request(request, source, env)
        assert source is not None  # plan_request refuses a request no exchange serves
        async for page in iter_pages(source, symbol, plan, env):
            room = cap - len(response.candles)
            if len(page) > room:
                page = page[:room]
                truncated = request.limit == 0 or request.limit > max_candles
            response.candles.extend(
                ohlc_row(request.ticker, request.period_seconds, c) for c in page
            )
            if len(response.candles) >= cap:
                break
    except RequestFailedError as exc:
        del response.candles[:]
        response.status = Status.ERROR
        response.reason = f"{exc.error_code}: {exc.reason}"
        return response
    except Exception as exc:
        log.exception("legacy request %s failed unexpectedly", request.request_id)
        del response.candles[:]
        response.status = Status.ERROR
        response.reason = f"{INTERNAL}: {type(exc).__name__}: {exc}"
        return response
    if truncated:
        del response.candles[:]
        response.status = Status.ERROR
        response.reason = (
            f"{TOO_MANY_CANDLES}: the range holds more than {max_candles} candles, more than "
            "a legacy response carries; set a limit, ask for a shorter range, or use the "
            "history flow (SubmitHistoricalRequest)"
        )
    elif not response.candles:
        response.status = Status.NOT_FOUND
        response.reason = "the exchange has no candles in the range"
    else:
        response.status = Status.OK
    return response
