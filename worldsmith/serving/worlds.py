"""The worlds a gateway can serve, named up front and loaded on first use.

A `WorldSource` knows its env_id without loading anything (a bundle directory's manifest, a catalog row),
and loads its bundle when called: the gateway routes by env_id from the start and loads a world at its
first session (serving/gateway.py). Naming 1,000 published worlds costs one catalog query.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from worldsmith.bundle.contract import MANIFEST, Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.models.bundle import Manifest


@dataclass(frozen=True)
class WorldSource:
    """A world to serve: its env_id, what named it (a directory or a catalog ref), and how to load its
    bundle (blocking; may raise: a bundle that fails validation, a store that cannot be reached)."""

    env_id: str
    origin: str
    load: Callable[[], Bundle]

    @classmethod
    def of(cls, bundle: Bundle) -> WorldSource:
        """A bundle already in memory."""
        return cls(bundle.env_id, str(bundle.root or bundle.env_id), lambda: bundle)


def directory_source(path: Path) -> WorldSource | None:
    """The bundle directory at `path`, named by its manifest alone (validated when loaded); None when
    `path` has no readable manifest (the caller loads it to report why)."""
    try:
        manifest = Manifest.model_validate_json((path / MANIFEST).read_bytes())
    except (OSError, ValidationError):
        return None
    return WorldSource(manifest.env_id, str(path), lambda: load_bundle(path))


def _published(env_id: str, ref: str, content_key: str) -> WorldSource:
    def load() -> Bundle:
        from worldsmith.storage.bundle_cache import cached_bundle

        return load_bundle(cached_bundle(ref, content_key))

    return WorldSource(env_id, ref, load)


def catalog_sources(refs: list[str], set_name: str | None = None) -> list[WorldSource]:
    """The published versions `refs` name (ENV or ENV@VERSION), then every member of set `set_name`:
    resolved in one catalog session, fetched into the local bundle cache only when loaded. Raises
    CatalogError for a ref or set the catalog does not have."""
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.publish import resolve
    from worldsmith.storage.sets import get_set, members_of

    with open_catalog().session() as session:
        versions = [resolve(session, ref) for ref in refs]
        if set_name is not None:
            versions += [version for version, _ in members_of(session, get_set(session, set_name))]
        return [_published(v.env_id, v.ref, v.content_key) for v in versions]
