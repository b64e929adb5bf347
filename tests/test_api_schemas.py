"""The API's schemas are held equal to what they mirror: a field added to a snapshot, a
limiter or the incident log shows in the API, or this fails.

Each response model lists the fields of the dataclass it serves (plus what the API adds,
named here); the incident models are checked against rows a real IncidentLog returns.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from replaywatch import model, state
from replaywatch.api import schemas
from replaywatch.diagnosis.lifecycle import Transition
from replaywatch.diagnosis.ratelimiter import TableDerived
from replaywatch.incidents import IncidentLog
from replaywatch.model import Finding, Severity

# (schema, the dataclass it mirrors, fields the API adds)
MIRRORS = [
    (schemas.TargetOut, state.SourceStatus, set()),
    (schemas.TableOut, model.TableSnapshot, {"derived", "consumption"}),
]


@pytest.mark.parametrize("schema,mirrored,added", MIRRORS, ids=[m[0].__name__ for m in MIRRORS])
def test_a_schema_has_the_fields_of_what_it_serves(schema: type[BaseModel], mirrored: type,
                                                   added: set[str]) -> None:
    fields = {f.name for f in dataclasses.fields(mirrored)}
    assert set(schema.model_fields) == fields | added


def test_nested_parts_are_served_as_the_dataclasses_themselves() -> None:
    # The limiter, sampler, worker time and derived values need no schema of their own.
    table = schemas.TableOut.model_fields
    assert table["rate_limiter"].annotation is model.RateLimiterInfo
    assert table["worker_time"].annotation is model.TableWorkerTime
    assert table["sampler"].annotation is model.KeyDistributionOptions
    assert TableDerived in typing.get_args(table["derived"].annotation)


def test_a_finding_is_served_as_its_one_document() -> None:
    f = Finding("sample_blocked", Severity.CRITICAL, "t:1", "replay", "s", {}, "fix", 1.0, 2.0)
    assert set(schemas.FindingOut.model_fields) == set(f.to_document()) | {"incident_id"}


def test_incident_models_are_the_rows_the_log_returns(tmp_path: Path) -> None:
    log = IncidentLog(str(tmp_path / "i.sqlite3"))
    assert log.connect()
    f = Finding("sample_blocked", Severity.CRITICAL, "t:1", "replay", "s", {"a": 1}, "fix",
                1.0, 2.0)
    log.apply([Transition("opened", f)], {"tables": {}, "probes": {}})
    [row] = log.list("all")
    assert set(row) == set(schemas.IncidentOut.model_fields)
    detail = log.get(row["id"])
    assert detail is not None
    assert set(detail) == set(schemas.IncidentDetailOut.model_fields)
    assert {*detail["events"][0]} == set(schemas.EventOut.model_fields)
    schemas.IncidentDetailOut(**detail)  # and the values validate
