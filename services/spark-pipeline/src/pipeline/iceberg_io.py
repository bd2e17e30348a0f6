"""The FileIO of the driver's pyiceberg client (`arrow_appends.ArrowAppends`): pyarrow's,
except that deleting a file that is already gone succeeds, as S3's own DELETE does.

Why: the pipeline's tables keep 100 metadata files (``write.metadata.delete-after-commit``,
`lake._COMMON_PROPERTIES`). On each commit the REST catalog deletes the one that falls
out, then pyiceberg deletes the same file after the commit returns; pyarrow looks the key
up first and raises FileNotFoundError, and pyiceberg logged a "Failed to delete metadata
file" warning for every commit of every table past its 100th.
"""

from __future__ import annotations

import contextlib

from pyiceberg.io import InputFile, OutputFile
from pyiceberg.io.pyarrow import PyArrowFileIO


class IdempotentDeletes(PyArrowFileIO):
    """`PyArrowFileIO` whose `delete` of a missing file is done (see the module)."""

    def delete(self, location: str | InputFile | OutputFile) -> None:
        with contextlib.suppress(FileNotFoundError):
            super().delete(location)
