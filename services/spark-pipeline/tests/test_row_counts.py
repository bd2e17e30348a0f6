"""Which files' rows are counted from metadata and which time ranges are read."""

from __future__ import annotations

from pipeline.row_counts import DataFile, split

LO, HI = 1_000, 2_000  # [LO, HI) in µs


def file(
    lower: int | None, upper: int | None, records: int = 10, deletes: bool = False
) -> DataFile:
    return DataFile(lower, upper, records, deletes)


def test_files_inside_the_range_without_deletes_are_counted_from_metadata() -> None:
    got = split([file(1_000, 1_400, 5), file(1_500, 1_999, 7)], LO, HI)
    assert (got.whole_rows, got.read) == (12, [])


def test_a_file_across_an_edge_is_read_within_the_range() -> None:
    got = split([file(500, 1_200, 9), file(1_300, 1_400, 4), file(1_900, 2_500, 8)], LO, HI)
    assert got.whole_rows == 4
    assert got.read == [(1_000, 1_200), (1_900, 1_999)]


def test_a_file_with_deletes_or_without_bounds_is_read() -> None:
    got = split([file(1_100, 1_200, deletes=True), file(None, None)], LO, HI)
    assert (got.whole_rows, got.read) == (0, [(1_000, 1_999)])


def test_a_whole_file_inside_a_read_range_is_read_instead_not_counted_twice() -> None:
    # The first file is read over [1_000, 1_500]; the second lies in it; the third
    # touches the second's span once that is read too (a chain).
    files = [
        file(900, 1_500, 3),
        file(1_400, 1_600, 5),
        file(1_600, 1_700, 6),
        file(1_800, 1_900, 2),
    ]
    got = split(files, LO, HI)
    assert got.whole_rows == 2
    assert got.read == [(1_000, 1_700)]


def test_spans_that_touch_are_joined() -> None:
    files = [file(900, 1_100, deletes=True), file(1_101, 1_300, deletes=True)]
    assert split(files, LO, HI).read == [(1_000, 1_300)]


def test_a_file_of_other_series_too_is_read_not_counted_from_metadata() -> None:
    """A bucket's file holds other tickers' rows as well: its record count is not the
    series'; a file of the series alone inside its span is read with it."""
    bucket = DataFile(1_100, 1_400, 50, False, series_only=False)
    got = split([bucket, file(1_200, 1_300, 7), file(1_500, 1_600, 4)], LO, HI)
    assert (got.whole_rows, got.read) == (4, [(1_100, 1_400)])
