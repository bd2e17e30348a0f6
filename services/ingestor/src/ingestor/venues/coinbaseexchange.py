"""Coinbase Exchange spot: GET /products/{id}/candles.

`start`/`end` (ISO 8601, inclusive) must both be given and span at most 300
candles, or the request is rejected; every candle of the window comes back,
newest first, as [time s, low, high, open, close, volume]: bounded windows.

Order books: ccxt 4.5.90 watches channel `level2`, which Coinbase serves only to
signed subscriptions since 2023, and signs every book subscription (without keys
it raises). `level2_batch` carries the same messages (a snapshot, then `l2update`s,
batched every 50 ms) to anyone, so it is watched unsigned. Neither carries a
sequence or a checksum: a lost message cannot be detected, only a reconnect.

    {"type": "l2update", "product_id": "BTC-USD", "time": "2019-08-14T20:42:27.265Z",
     "changes": [["buy", "10101.80000000", "0.162567"]]}
"""

from ingestor.venues.base import Paging, TradePaging, Venue

VENUE = Venue(
    exchange_id="coinbaseexchange",
    paging=Paging.NEWEST_IN_WINDOW,
    page_cap=300,
    book_params={"channels": ["level2_batch"]},
    public_books=True,
    prefix="COINBASE",
    status_url="https://api.exchange.coinbase.com/time",
    # GET /products/{id}/trades: `after` = the trades older than that trade_id.
    trade_paging=TradePaging.BY_ID_BACKWARD,
    trade_id_param="after",
    # ccxt 4.5.90 `fetch_tickers` reads GET /products/spark-lines: OHLC, no volume.
    tickers_unsupported="ccxt's fetchTickers reads /products/spark-lines, which has no volume",
)
