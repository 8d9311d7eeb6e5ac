"""Catalog helpers for tests: publish bundles and make a set of them."""

from __future__ import annotations

from worldsmith.bundle.contract import Bundle


def published_set(name: str, bundles: list[Bundle], validation_fraction: float) -> str:
    """Publish `bundles` to the current WORLDSMITH_HOME's store and catalog and make set `name` of them."""
    from worldsmith.settings import get_settings
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import open_store
    from worldsmith.storage.publish import publish
    from worldsmith.storage.sets import SetQuery, create_set

    store, catalog = open_store(get_settings().resolved_store_url()), open_catalog()
    for bundle in bundles:
        publish(bundle, store, catalog)
    create_set(catalog, name, SetQuery(validation_fraction=validation_fraction))
    return name
