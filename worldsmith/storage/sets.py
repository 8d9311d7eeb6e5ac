"""Environment sets: named, immutable selections of environment versions built from a query,
split into train and validation by environment, exported for external trainers."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypedDict

from sqlalchemy import func, insert
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from worldsmith.jsonvalue import JsonObject
from worldsmith.models.catalog import Environment, EnvironmentSet, EnvironmentSetMember, EnvironmentVersion
from worldsmith.models.sets import SetQuery
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import ObjectStore
from worldsmith.storage.publish import CatalogError, fetch


def candidates(session: Session, query: SetQuery) -> list[EnvironmentVersion]:
    """The versions `query` may choose from (before sampling): loadable bundles of its status that match its
    filters, the latest per environment unless `latest_only` is off."""
    where = [col(EnvironmentVersion.status) == query.status, col(EnvironmentVersion.failed_stage).is_(None)]
    if query.env_ids:
        where.append(col(EnvironmentVersion.env_id).in_(query.env_ids))
    rows = session.exec(
        select(EnvironmentVersion, Environment)
        .join(Environment)
        .where(*where)
        .order_by(col(EnvironmentVersion.env_id), col(EnvironmentVersion.version))
    ).all()
    chosen: dict[str, EnvironmentVersion] = {}
    keep: list[EnvironmentVersion] = []
    for version, env in rows:
        if query.categories and not set(query.categories) & set(env.categories):
            continue
        if version.stats.get("tasks", 0) < query.min_tasks or version.stats.get("tools", 0) < query.min_tools:
            continue
        if any(not version.quality.get(kind, {}).get("passed") for kind in query.require_passed):
            continue
        if query.latest_only:
            chosen[version.env_id] = version  # ordered by version: the last one wins
        else:
            keep.append(version)
    return sorted(chosen.values(), key=lambda v: v.env_id) if query.latest_only else keep


def _rank(seed: int, env_id: str) -> str:
    return hashlib.sha256(f"{seed}:{env_id}".encode()).hexdigest()


def select_members(candidates: list[EnvironmentVersion], query: SetQuery) -> list[tuple[EnvironmentVersion, str]]:
    """Sample and split deterministically: the same catalog and query give the same set."""
    pool = sorted(candidates, key=lambda v: (v.env_id, v.version))
    if query.count is not None:
        if query.count > len(pool):
            raise CatalogError(f"the query matches {len(pool)} environment versions, fewer than count={query.count}")
        pool = random.Random(query.seed).sample(pool, query.count)
    envs = sorted({v.env_id for v in pool}, key=lambda e: _rank(query.seed, e))
    n_val = round(len(envs) * query.validation_fraction)
    if query.validation_fraction > 0 and n_val == 0 and len(envs) >= 2:
        n_val = 1
    validation = set(envs[:n_val])
    return sorted(
        ((v, "validation" if v.env_id in validation else "train") for v in pool),
        key=lambda m: (m[0].env_id, m[0].version),
    )


def create_set(catalog: Catalog, name: str, query: SetQuery) -> EnvironmentSet:
    """Create set `name` from `query`. Sets are immutable: an existing name is refused."""
    with catalog.session() as session:
        if session.exec(select(EnvironmentSet).where(EnvironmentSet.name == name)).first() is not None:
            raise CatalogError(f"environment set {name!r} already exists (sets are immutable; choose another name)")
        members = select_members(candidates(session, query), query)
        if not members:
            raise CatalogError(
                f"no environment version matches the query {query.model_dump(exclude_defaults=True)}; "
                "loosen it, or generate or publish environments first (`worldsmith catalog ls` lists them)"
            )
    try:
        with catalog.session() as session:
            env_set = EnvironmentSet(name=name, query=query.model_dump())
            session.add(env_set)
            session.flush()
            rows = [{"set_id": env_set.id, "version_id": version.id, "split": split} for version, split in members]
            session.execute(insert(EnvironmentSetMember), rows)  # one bulk insert, not an object per member
        return env_set
    except IntegrityError:
        raise CatalogError(f"environment set {name!r} already exists") from None


def get_set(session: Session, name: str) -> EnvironmentSet:
    found = session.exec(select(EnvironmentSet).where(EnvironmentSet.name == name)).first()
    if found is None:
        raise CatalogError(f"no environment set {name!r} (`worldsmith sets ls` lists them)")
    return found


def member_refs(catalog: Catalog, name: str) -> list[tuple[str, str]]:
    """(catalog reference `ENV@VERSION`, split) of each member of set `name`; CatalogError when there is no such set."""
    with catalog.session() as session:
        return [(version.ref, split) for version, split in members_of(session, get_set(session, name))]


def members_in_split(catalog: Catalog, name: str, split: str) -> int:
    """How many members set `name` has in `split` ("all": in any); a CatalogError naming the problem
    if the set does not exist or has none there. What a run checks before it starts anything."""
    with catalog.session() as session:
        set_id = get_set(session, name).id
        assert set_id is not None  # a stored set has its id
        splits = split_counts(session, set_id).get(set_id, {})
    count = sum(splits.values()) if split == "all" else splits.get(split, 0)
    if not count:
        raise CatalogError(f"set {name!r} has no members in split {split!r}")
    return count


@dataclass(frozen=True)
class SetSummary:
    """One line of `sets ls`: a set's name, member counts by split, and when it was made."""

    name: str
    members: int
    train: int
    created_at: datetime


def split_counts(session: Session, set_id: int | None = None) -> dict[int, dict[str, int]]:
    """Members per split of every set, or of set `set_id` alone: {set id: {split: count}}, counted in SQL."""
    query = select(EnvironmentSetMember.set_id, EnvironmentSetMember.split, func.count()).group_by(
        col(EnvironmentSetMember.set_id), col(EnvironmentSetMember.split)
    )
    if set_id is not None:
        query = query.where(EnvironmentSetMember.set_id == set_id)
    counts: dict[int, dict[str, int]] = {}
    for member_set, split, count in session.exec(query).all():
        counts.setdefault(member_set, {})[split] = count
    return counts


def set_summaries(session: Session) -> list[SetSummary]:
    """Every environment set, by name, with its member counts."""
    counts = split_counts(session)
    summaries = []
    for env_set in session.exec(select(EnvironmentSet).order_by(EnvironmentSet.name)).all():
        assert env_set.id is not None  # a stored set has its id
        splits = counts.get(env_set.id, {})
        summaries.append(SetSummary(env_set.name, sum(splits.values()), splits.get("train", 0), env_set.created_at))
    return summaries


def members_of(session: Session, env_set: EnvironmentSet) -> list[tuple[EnvironmentVersion, str]]:
    rows = session.exec(
        select(EnvironmentVersion, EnvironmentSetMember.split)
        .join(EnvironmentSetMember, col(EnvironmentSetMember.version_id) == EnvironmentVersion.id)
        .where(EnvironmentSetMember.set_id == env_set.id)
        .order_by(EnvironmentVersion.env_id)
    ).all()
    return [(version, split) for version, split in rows]


class SetMemberRecord(TypedDict):
    """One member of a set as `set.json` lists it."""

    ref: str
    env_id: str
    version: int
    content_key: str
    manifest: str  # the manifest's digest
    split: str


class SetManifest(TypedDict):
    """A set as JSON (`set.json`, `sets show --json`)."""

    format: str
    name: str
    query: JsonObject  # the SetQuery it was built from
    created_at: str  # ISO 8601
    members: list[SetMemberRecord]


class TaskRow(TypedDict):
    """One (env, task) row of an exported set's `tasks.jsonl` and `tasks.parquet`."""

    set: str
    env_id: str
    version: int
    ref: str
    content_key: str
    split: str
    task_id: str
    instruction: str
    verifier: str
    answer: str | None
    solution: str  # the reference solution's steps as JSON text


def set_manifest(session: Session, env_set: EnvironmentSet) -> SetManifest:
    """The set as JSON: its query and every member's version id, hashes and split."""
    return {
        "format": "worldsmith-set/1",
        "name": env_set.name,
        "query": env_set.query,
        "created_at": env_set.created_at.isoformat(),
        "members": [
            {
                "ref": v.ref,
                "env_id": v.env_id,
                "version": v.version,
                "content_key": v.content_key,
                "manifest": v.manifest_digest,
                "split": split,
            }
            for v, split in members_of(session, env_set)
        ],
    }


def export_set(name: str, target: Path, store: ObjectStore, catalog: Catalog) -> SetManifest:
    """Write set `name` into `target`: `set.json`, every member bundle under `bundles/ENV@V/`, and
    one row per (env, task) in `tasks.jsonl` and `tasks.parquet`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with catalog.session() as session:
        manifest = set_manifest(session, get_set(session, name))
    target.mkdir(parents=True, exist_ok=True)
    rows: list[TaskRow] = []
    for member in manifest["members"]:
        bundle = fetch(member["ref"], target / "bundles" / member["ref"], store, catalog)
        for task in bundle.tasks:
            rows.append(
                {
                    "set": name,
                    "env_id": member["env_id"],
                    "version": member["version"],
                    "ref": member["ref"],
                    "content_key": member["content_key"],
                    "split": member["split"],
                    "task_id": task.id,
                    "instruction": task.instruction,
                    "verifier": task.verifier,
                    "answer": task.answer,
                    "solution": json.dumps([s.model_dump() for s in task.solution]),
                }
            )
    (target / "set.json").write_text(json.dumps(manifest, indent=2) + "\n")
    with (target / "tasks.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    pq.write_table(pa.Table.from_pylist(rows), target / "tasks.parquet")
    return manifest
