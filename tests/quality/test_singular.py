"""The one English singular of table names (quality/world_values.singular) the probes, the seed view and
the verifier mutations match tools, arguments and task words to tables by."""

from __future__ import annotations

import pytest

from worldsmith.quality.seedview import Table, filtered_tables
from worldsmith.quality.verifier_mutations import singulars
from worldsmith.quality.world_values import singular, words

pytestmark = pytest.mark.unit

PLURALS = {
    "classes": "class",
    "categories": "category",
    "statuses": "status",
    "people": "person",
    "addresses": "address",
    "boxes": "box",
    "orders": "order",
    "branches": "branch",
    "employees": "employee",
    "menus": "menu",
    "children": "child",
    "order_items": "order_item",
    "sales_people": "sales_person",
}


@pytest.mark.parametrize(("plural", "one"), PLURALS.items())
def test_a_plural_gives_its_singular_and_the_singular_stays(plural, one):
    assert singular(plural) == one
    assert singular(one) == one


def test_class_stays_class():
    assert singular("class") == "class" and singular("status") == "status" and singular("address") == "address"


def test_words_and_the_mutations_names_use_the_same_singular():
    assert words("listClassesByStatuses people") == ["list", "class", "by", "status", "person"]
    assert singulars("sales_people") == ["sales_person", "person"]
    assert singulars("addresses") == ["address"] and singulars("boxes") == ["box"]


def test_the_seed_view_finds_a_table_a_task_names_in_the_singular_or_plural():
    tables = [Table(name, ["id"], []) for name in ("classes", "statuses", "people", "boxes", "categories")]
    assert filtered_tables(tables, ["Enrol Ana in the class"]) == ["classes"]
    assert filtered_tables(tables, ["every class of each status"]) == ["classes", "statuses"]
    assert filtered_tables(tables, ["the person who packed two boxes"]) == ["people", "boxes"]
    assert filtered_tables(tables, ["list the categories"]) == ["categories"]
