"""The collector's /admin/erasures: erasure requests over HTTP, behind their own token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from pydantic import SecretStr
from test_receiver_feedback import Health

from spanmill.collector.app import create_app
from spanmill.collector.metrics import CollectorMetrics
from spanmill.keys import KeyRing
from spanmill.spans import Span
from spanmill.store import SpanStore, table_from_spans
from spanmill.store.erasure import read_erasures
from spanmill.store.writer import StoreWriter

TOKEN = "admin-" + "x" * 24


def _client(store: Path, admin: KeyRing | None) -> TestClient:
    return TestClient(create_app(Health(), CollectorMetrics(), admin=admin, store=(str(store), {})))


def _store(root: Path) -> None:
    """Ten spans of one hour, each its own trace: four of Ann's, six of Bob's."""
    start = 1_750_000_000_000_000_000
    spans = [
        Span(
            trace_id=f"{i + 1:032x}", span_id=f"{i + 1:016x}", name="chat",
            start_time_unix_nano=start + i, end_time_unix_nano=start + i + 1,
            attributes={"enduser.id": "ann" if i < 4 else "bob"},
        )
        for i in range(10)
    ]  # fmt: skip
    StoreWriter(str(root)).write_file("dt=2025-06-15/hour=15/t.parquet", table_from_spans(spans))


def test_erasure_requests_over_http_need_the_admin_token(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root)
    with _client(root, KeyRing(admin_key=SecretStr(TOKEN))) as client:
        body: dict[str, Any] = {"user_id": "ann", "requested_by": "dpo", "reason": "ticket 9"}
        assert client.post("/admin/erasures", json=body).status_code == 401
        wrong = {"authorization": "Bearer " + "y" * 30}
        assert client.post("/admin/erasures", json=body, headers=wrong).status_code == 401
        auth = {"authorization": f"Bearer {TOKEN}"}
        bad = client.post("/admin/erasures", json={"user_id": "ann"}, headers=auth)
        assert bad.status_code == 400 and "requested_by" in bad.json()["error"]["message"]
        two = {**body, "trace_id": "ab" * 16}
        assert client.post("/admin/erasures", json=two, headers=auth).status_code == 400
        made = client.post("/admin/erasures", json=body, headers=auth)
        assert made.status_code == 202, made.text
        record = made.json()
        assert "value" not in record and len(record["trace_ids"]) == 4
        assert record["requested_by"] == "dpo" and record["status"] == "pending"
        listed = client.get("/admin/erasures", headers=auth).json()["erasures"]
        assert [r["id"] for r in listed] == [record["id"]]
        assert "ann" not in client.get("/admin/erasures", headers=auth).text
    assert SpanStore(str(root)).count() == 6
    (stored,) = read_erasures(SpanStore(str(root)).fs, str(root))
    assert stored.reason == "ticket 9"


def test_without_an_admin_credential_the_routes_are_shut(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root)
    with _client(root, None) as client:
        reply = client.post(
            "/admin/erasures",
            json={"user_id": "ann", "requested_by": "dpo"},
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        assert reply.status_code == 403
    assert SpanStore(str(root)).count() == 10
