"""One settings loader: defaults < YAML file < environment < explicit overrides.

Every service subclasses `FileSettings` and calls `load_settings`, so a config
is always validated the same way and stays a plain, picklable instance (Spark
ships the pipeline's settings to worker processes). Keys renamed to the shared
vocabulary (`kafka.bootstrap_servers`, `_s` for seconds) are listed in the
class's `renamed`; old names keep working in the file, the environment and
overrides, with a warning naming the new key. A specification's own name for a
key (the relay's `request_timeout_secs`) is listed in `aliases`: read as the
key, without a warning, because a config written from the spec is not outdated.

Sections several services share live here too: `CatalogSettings` (the REST
catalog and its S3 store), with `pyiceberg_properties` as the one builder for
every pyiceberg reader (the SDK, the ingestor's coverage planning), so
path-style S3 and the optional keys are set the same way.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
)

log = logging.getLogger(__name__)

# The file's values for the settings being built right now: the sources hook is a
# classmethod, and a per-call subclass carrying them could not be pickled.
_FILE_VALUES: ContextVar[dict[str, Any] | None] = ContextVar("_FILE_VALUES", default=None)


class FileSettings(BaseSettings):
    """Base of every service's settings; `renamed` maps old dotted keys to new ones
    (read with a deprecation warning), `aliases` a specification's names to ours
    (read silently), `retired` keys that no longer mean anything to why (ignored with
    a warning: an old config file still starts the service)."""

    renamed: ClassVar[Mapping[str, str]] = {}
    aliases: ClassVar[Mapping[str, str]] = {}
    retired: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def current_names(cls, data: dict[str, Any], where: str = "") -> dict[str, Any]:
        """`data` with the spec's names (silently) and old names (with a warning) moved
        to the current ones, and retired keys dropped (with a warning)."""
        data = rename_keys(cls.aliases, data, warn=False)
        data = rename_keys(cls.renamed, data, where)
        return drop_keys(cls.retired, data, where)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file_values = _FILE_VALUES.get() or {}
        return (
            InitSettingsSource(settings_cls, cls.current_names(dict(init_settings()))),
            _RenamingEnv(settings_cls, cls.renamed, cls.aliases, cls.retired),
            InitSettingsSource(settings_cls, file_values),
        )


class _RenamingEnv(EnvSettingsSource):
    """Environment variables, with the old name of a renamed key read as the new one."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        renamed: Mapping[str, str],
        aliases: Mapping[str, str],
        retired: Mapping[str, str],
    ) -> None:
        self._renamed = renamed
        self._aliases = aliases
        self._retired = retired
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        env = dict(super()._load_env_vars())
        delimiter = self.env_nested_delimiter or "__"
        renames = [(*pair, False) for pair in self._aliases.items()]
        renames += [(*pair, True) for pair in self._renamed.items()]
        for old, new, warn in renames:
            old_var, new_var = (self.env_prefix + key.replace(".", delimiter) for key in (old, new))
            if not self.case_sensitive:
                old_var, new_var = old_var.lower(), new_var.lower()
            if old_var in env:
                if warn:
                    _deprecated(f"environment variable {old_var.upper()}", new_var.upper())
                value = env.pop(old_var)
                env.setdefault(new_var, value)
        for key, why in self._retired.items():
            var = self.env_prefix + key.replace(".", delimiter)
            if (var if self.case_sensitive else var.lower()) in env:
                env.pop(var if self.case_sensitive else var.lower())
                _retired(f"environment variable {var.upper()}", why)
        return env


S = TypeVar("S", bound=FileSettings)


def load_settings(
    cls: type[S],
    path: str | Path | None = None,
    *,
    path_env: str = "CONFIG_PATH",
    required: bool = True,
    **overrides: Any,
) -> S:
    """Validated settings from the YAML file at `path` (else `$path_env`, if set), the
    environment and `overrides`.

    A missing file is an error unless `required` is false: a typo in a path must
    not fall back to defaults that point at another Kafka.
    """
    label = str(path)
    if path is None and os.environ.get(path_env):
        path = Path(os.environ[path_env])
        label = f"{path_env}={path}"
    values: dict[str, Any] = {}
    if path is not None and (required or Path(path).exists()):
        if not Path(path).is_file():
            service = cls.__module__.partition(".")[0]
            raise FileNotFoundError(f"{service} config file not found: {label}")
        values = cls.current_names(read_yaml(Path(path)), where=f"{label}: ")
    token = _FILE_VALUES.set(values)
    try:
        return cls(**overrides)
    finally:
        _FILE_VALUES.reset(token)


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML file; ValueError says what is wrong with it."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"config file {path} must hold a mapping of keys, not {type(data).__name__}"
        )
    return data


def rename_keys(
    renamed: Mapping[str, str], data: dict[str, Any], where: str = "", *, warn: bool = True
) -> dict[str, Any]:
    """`data` with every old dotted key moved to its new name (the new name wins if both);
    `warn`: say that the old name is deprecated."""
    for old, new in renamed.items():
        *old_parents, old_leaf = old.split(".")
        section = _section(data, old_parents, create=False)
        if section is None or old_leaf not in section:
            continue
        if warn:
            _deprecated(f"{where}config key {old}", new)
        value = section.pop(old_leaf)
        *new_parents, new_leaf = new.split(".")
        target = _section(data, new_parents, create=True)
        assert target is not None
        target.setdefault(new_leaf, value)
    return data


def drop_keys(retired: Mapping[str, str], data: dict[str, Any], where: str = "") -> dict[str, Any]:
    """`data` without the retired dotted keys, each one found warned about."""
    for key, why in retired.items():
        *parents, leaf = key.split(".")
        section = _section(data, parents, create=False)
        if section is not None and leaf in section:
            section.pop(leaf)
            _retired(f"{where}config key {key}", why)
    return data


def _section(data: dict[str, Any], keys: list[str], *, create: bool) -> dict[str, Any] | None:
    for key in keys:
        child = data.get(key)
        if not isinstance(child, dict):
            if not create or child is not None:
                return None
            child = data[key] = {}
        data = child
    return data


def _retired(what: str, why: str) -> None:
    message = f"{what} is no longer used and is ignored: {why}"
    log.warning(message)
    warnings.warn(message, DeprecationWarning, stacklevel=4)


def _deprecated(old: str, new: str) -> None:
    message = f"{old} is deprecated: use {new}"
    log.warning(message)
    warnings.warn(message, DeprecationWarning, stacklevel=4)


def pyiceberg_properties(
    uri: str,
    *,
    s3_endpoint: str,
    s3_region: str,
    warehouse: str = "",
    s3_access_key: str = "",
    s3_secret_key: str = "",
) -> dict[str, str]:
    """Properties for `pyiceberg.catalog.load_catalog`.

    Empty values are left out, so the catalog's own client defaults (`GET
    /v1/config`: the S3 endpoint, path style, region and keys the platform's catalog
    hands out) apply; anything set here wins over them.
    """
    props = {"type": "rest", "uri": uri}
    if s3_endpoint:
        props["s3.endpoint"] = s3_endpoint
        props["s3.path-style-access"] = "true"
    if s3_region:
        props["s3.region"] = s3_region
    if warehouse:
        props["warehouse"] = warehouse
    if s3_access_key:
        props["s3.access-key-id"] = s3_access_key
    if s3_secret_key:
        props["s3.secret-access-key"] = s3_secret_key
    return props


class CatalogSettings(BaseModel):
    """A service's connection to the REST catalog and its S3 store (a config section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "rest"
    uri: str = "http://127.0.0.1:8181"
    warehouse: str = ""
    # Empty: what the catalog hands out (docs/adr/0007-iceberg-catalog.md).
    s3_endpoint: str = ""
    s3_region: str = ""
    s3_access_key: str = ""
    s3_secret_key: str = ""

    def properties(self) -> dict[str, str]:
        return pyiceberg_properties(
            self.uri,
            s3_endpoint=self.s3_endpoint,
            s3_region=self.s3_region,
            warehouse=self.warehouse,
            s3_access_key=self.s3_access_key,
            s3_secret_key=self.s3_secret_key,
        )
