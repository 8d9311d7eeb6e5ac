"""The local bundle cache: published environment versions fetched from the object store once, by
content key, into WORLDSMITH_HOME/cache/bundles."""

from __future__ import annotations

from pathlib import Path

from worldsmith.settings import get_settings
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import configured_store
from worldsmith.storage.publish import fetch


def cached_bundle(ref: str, content_key: str) -> Path:
    """The bundle of `ref`, fetched once into WORLDSMITH_HOME/cache/bundles/<content key>."""
    settings = get_settings()
    target = settings.home / "cache" / "bundles" / content_key
    if not (target / "manifest.json").is_file():
        fetch(ref, target, configured_store(), open_catalog())
    return target
