"""A Triton replica's readiness (``spanmill triton ready``): what it must hold of the routes.

The index entries below are the shapes tritonserver answers ``POST /v2/repository/index``
with in each case; the services test in tests/rollout/test_triton_fleet.py runs the same
check against real servers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from spanmill.cli.main import app
from spanmill.errors import ConfigError
from spanmill.gateway.routing import RoutingTable
from spanmill.serving.readiness import ReadinessError, check, missing_versions, read_routes
from spanmill.serving.readiness import routed_versions as routed


def table(**routes: dict[str, float]) -> RoutingTable:
    return RoutingTable.model_validate({"revision": 7, "routes": {
        name: {"triton_model": name,
               "backends": [{"version": v, "weight": w} for v, w in weights.items()]}
        for name, weights in routes.items()
    }})  # fmt: skip


def test_only_versions_that_take_traffic_are_required() -> None:
    assert routed(table(calc={"1": 80, "2": 20}, sql={"4": 100, "5": 0})) == {
        ("calc", 1), ("calc", 2), ("sql", 4)}  # fmt: skip
    assert routed(RoutingTable()) == set()
    # A vLLM engine serves every version of its model, as Triton version 1.
    engine = RoutingTable.model_validate({"routes": {"calc": {
        "triton_model": "calc", "flavour": "vllm", "base_model": "org/base",
        "backends": [{"version": "3", "weight": 90, "lora_name": "calc-v3"},
                     {"version": "4", "weight": 10, "lora_name": "calc-v4"}]}}})  # fmt: skip
    assert routed(engine) == {("calc", 1)}


def test_a_new_replica_lacks_what_it_has_not_loaded() -> None:
    wanted = routed(table(calc={"1": 80, "2": 20}))
    # Just started: the model is in the repository, nothing is loaded.
    assert missing_versions(wanted, [{"name": "calc"}]) == [
        "calc version 1: the model is not loaded",
        "calc version 2: the model is not loaded",
    ]
    loading = [{"name": "calc", "version": "1", "state": "READY"},
               {"name": "calc", "version": "2", "state": "LOADING"}]  # fmt: skip
    assert missing_versions(wanted, loading) == ["calc version 2: LOADING"]
    failed = [{"name": "calc", "version": "1", "state": "READY"},
              {"name": "calc", "version": "2", "state": "UNAVAILABLE",
               "reason": "Internal: RuntimeError: boom\n\nAt:\n  model.py(1)"}]  # fmt: skip
    assert missing_versions(wanted, failed) == [
        "calc version 2: UNAVAILABLE (Internal: RuntimeError: boom)"
    ]
    ready = [{"name": "calc", "version": "1", "state": "READY"},
             {"name": "calc", "version": "2", "state": "READY"}]  # fmt: skip
    assert missing_versions(wanted, ready) == []


def test_what_no_replica_can_hold_does_not_take_them_all_out() -> None:
    """The mounted table may lag the ConfigMap, or name what no repository holds."""
    wanted = routed(table(calc={"1": 80, "2": 20}, typo={"1": 100}))
    index = [
        # Rolled back and unloaded by the controller (and leaving, in the second case).
        {"name": "calc", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "calc", "version": "1", "state": "READY"},
        # Other models of the repository are none of this table's business.
        {"name": "other"},
    ]
    assert missing_versions(wanted, index) == []
    index[0] = {"name": "calc", "version": "2", "state": "UNLOADING"}
    assert missing_versions(wanted, index) == []
    # A version whose folder was gone when the model was last loaded.
    assert missing_versions(wanted, index[1:]) == []


def test_the_routing_file(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    assert read_routes(path) == RoutingTable()  # not written yet: nothing is routed
    path.write_text("")
    assert read_routes(path) == RoutingTable()
    path.write_text(table(calc={"3": 100}).dumps())
    assert read_routes(path).revision == 7
    path.write_text("{broken")
    with pytest.raises(ConfigError, match=r"routes\.json is invalid"):
        read_routes(path)


def test_an_unreachable_server_is_not_ready() -> None:
    with pytest.raises(ReadinessError, match=r"cannot ask Triton at 127\.0\.0\.1:1"):
        check("127.0.0.1:1", RoutingTable(), timeout_s=1)


def test_the_command_exits_1_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "routes.json"
    path.write_text("{broken")
    result = CliRunner().invoke(app, ["triton", "ready", "--routing-file", str(path),
                                      "--url", "127.0.0.1:1", "--timeout", "1"])  # fmt: skip
    assert result.exit_code == 1
    # A broken table is reported and otherwise ignored; the server is judged on its health.
    assert "ignoring the routing table" in result.output
    assert "cannot ask Triton at 127.0.0.1:1" in result.output
