"""The SDK's optional extras: what each needs, and the one message naming it.

Charts (matplotlib) and DataFrames (pandas) are extras so that services built
on the SDK (the gateway) and minimal installs carry neither; a feature whose
extra is missing fails with the `pip install` line that brings it, never with
a bare ModuleNotFoundError.
"""

from __future__ import annotations

import importlib.util

#: extra name -> the top-level modules it installs (pyproject.toml, optional-dependencies)
EXTRAS: dict[str, tuple[str, ...]] = {
    "chart": ("matplotlib",),
    "pandas": ("pandas",),
}


class MissingExtraError(ImportError):
    """A feature needs an optional extra of mdclient that is not installed."""

    def __init__(self, extra: str, feature: str) -> None:
        super().__init__(missing_message(extra, feature))
        self.extra = extra


def missing_message(extra: str, feature: str) -> str:
    modules = " and ".join(EXTRAS[extra])
    return (
        f"{feature} needs {modules}, part of the optional extra 'mdclient[{extra}]': "
        f"install it with  pip install 'mdclient[{extra}]'"
    )


def installed(extra: str) -> bool:
    """True when every module of `extra` can be imported (found, not imported)."""
    return all(importlib.util.find_spec(module) is not None for module in EXTRAS[extra])


def require(extra: str, feature: str) -> None:
    """Raise MissingExtraError (with the install line) unless `extra` is installed."""
    if not installed(extra):
        raise MissingExtraError(extra, feature)
