"""The local bundle cache: published environment versions fetched from the object store once, by
content key, into WORLDSMITH_HOME/cache/bundles; and `open_bundle`, a bundle by directory or by
catalog reference."""

from __future__ import annotations

from pathlib import Path

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import configured_store
from worldsmith.storage.publish import fetch, resolve


def cached_bundle(ref: str, content_key: str) -> Path:
    """The bundle of `ref`, fetched once into WORLDSMITH_HOME/cache/bundles/<content key>."""
    settings = get_settings()
    target = settings.home / "cache" / "bundles" / content_key
    if not (target / "manifest.json").is_file():
        fetch(ref, target, configured_store(), open_catalog())
    return target


def open_bundle(source: str | Path) -> Bundle:
    """The bundle `source` names: a directory (a `Path`, or a string that names an existing path or
    holds a `/`), loaded as it is (BundleError says what is wrong with it); else a catalog reference,
    `ENV@VERSION` or `ENV` for its latest good version, fetched once into the cache (CatalogError for
    a reference the catalog does not have, or a failed world that stopped before it was a bundle)."""
    path = Path(source)
    if isinstance(source, Path) or "/" in source or path.exists():
        return load_bundle(path)
    with open_catalog().session() as session:
        version = resolve(session, source)
    return load_bundle(cached_bundle(version.ref, version.content_key))
