"""A local HTTP server speaking the KFP v2beta1 paths that kfp.Client uses.

Shapes follow the kfp-server-api models (V2beta1Pipeline, V2beta1PipelineVersion,
V2beta1Experiment, V2beta1RecurringRun); every request is recorded for asserts.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import FastAPI, File, Query, Request, UploadFile


def kfp_app() -> FastAPI:
    app = FastAPI()
    app.state.pipelines = {}  # id -> {"display_name", "versions": [..]}
    app.state.experiments = {}
    app.state.recurring = []
    app.state.auth = []

    @app.middleware("http")
    async def record_auth(request: Request, call_next: Any) -> Any:
        app.state.auth.append(request.headers.get("authorization"))
        return await call_next(request)

    @app.get("/apis/v2beta1/healthz")
    def healthz() -> dict[str, Any]:
        return {"multi_user": False}

    def _matching(filter_text: str | None, items: dict[str, Any]) -> list[dict[str, Any]]:
        if not filter_text:
            return list(items.values())
        predicate = json.loads(filter_text)["predicates"][0]
        wanted = predicate.get("string_value", predicate.get("stringValue"))
        return [i for i in items.values() if i["display_name"] == wanted]

    @app.get("/apis/v2beta1/pipelines")
    def list_pipelines(filter: str | None = Query(None)) -> dict[str, Any]:
        found = _matching(filter, app.state.pipelines)
        return {"pipelines": [_public(p) for p in found] or None, "total_size": len(found)}

    def _public(p: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in p.items() if k != "versions"}

    @app.post("/apis/v2beta1/pipelines/upload")
    async def upload(uploadfile: UploadFile = File(...), name: str = Query(None)) -> dict[str, Any]:
        content = (await uploadfile.read()).decode()
        pipeline_id = uuid.uuid4().hex
        app.state.pipelines[pipeline_id] = {
            "pipeline_id": pipeline_id, "display_name": name, "versions": [content],
            "created_at": "2026-01-01T00:00:00Z",
        }  # fmt: skip
        return _public(app.state.pipelines[pipeline_id])

    @app.post("/apis/v2beta1/pipelines/upload_version")
    async def upload_version(
        uploadfile: UploadFile = File(...),
        name: str = Query(None),
        pipelineid: str = Query(...),
    ) -> dict[str, Any]:
        content = (await uploadfile.read()).decode()
        pipeline = app.state.pipelines[pipelineid]
        pipeline["versions"].append(content)
        version = {"pipeline_id": pipelineid, "pipeline_version_id": uuid.uuid4().hex,
                   "display_name": name,
                   "created_at": f"2026-01-01T00:00:{len(pipeline['versions']):02d}Z"}  # fmt: skip
        pipeline.setdefault("version_records", []).append(version)
        return version

    @app.get("/apis/v2beta1/pipelines/{pipeline_id}/versions")
    def list_versions(
        pipeline_id: str, page_size: int = Query(10), sort_by: str = Query("")
    ) -> dict[str, Any]:
        versions = list(app.state.pipelines[pipeline_id].get("version_records", []))
        key, _, order = sort_by.partition(" ")
        if key:
            versions.sort(key=lambda v: v[key], reverse=order == "desc")
        return {"pipeline_versions": versions[:page_size] or None, "total_size": len(versions)}

    @app.get("/apis/v2beta1/experiments")
    def list_experiments(filter: str | None = Query(None)) -> dict[str, Any]:
        found = _matching(filter, app.state.experiments)
        return {"experiments": found or None, "total_size": len(found)}

    @app.post("/apis/v2beta1/experiments")
    async def create_experiment(request: Request) -> dict[str, Any]:
        body = await request.json()
        experiment_id = uuid.uuid4().hex
        app.state.experiments[experiment_id] = {"experiment_id": experiment_id, **body}
        return app.state.experiments[experiment_id]

    @app.post("/apis/v2beta1/recurringruns")
    async def create_recurring(request: Request) -> dict[str, Any]:
        body = await request.json()
        body["recurring_run_id"] = uuid.uuid4().hex
        app.state.recurring.append(body)
        return body

    @app.get("/apis/v2beta1/recurringruns")
    def list_recurring(
        experiment_id: str | None = Query(None), filter: str | None = Query(None)
    ) -> dict[str, Any]:
        found = [r for r in app.state.recurring
                 if experiment_id in (None, r.get("experiment_id"))]  # fmt: skip
        if filter:
            predicate = json.loads(filter)["predicates"][0]
            wanted = predicate.get("string_value", predicate.get("stringValue"))
            found = [r for r in found if r["display_name"] == wanted]
        return {"recurringRuns": found or None, "total_size": len(found)}

    @app.delete("/apis/v2beta1/recurringruns/{run_id}")
    def delete_recurring(run_id: str) -> dict[str, Any]:
        app.state.recurring = [r for r in app.state.recurring if r["recurring_run_id"] != run_id]
        return {}

    return app
