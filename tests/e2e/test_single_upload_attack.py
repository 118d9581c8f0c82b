"""A single run's upload is a batch of one: attacked against a real server process as a hostile or
unlucky agent would (the same results sent many times at once over both endpoints, NaN, a body
that is not JSON, a huge one), it is stored once, refused by name, and never answered 500."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.support.api import bearer
from tests.support.services import query
from tests.support.sweeps import register, result_for, submit


def test_a_run_uploaded_many_times_at_once_over_both_endpoints_is_stored_once(stack) -> None:
    tokens = stack.tokens
    agent = bearer(tokens["agent"])
    with httpx.Client(base_url=stack.server_url, timeout=60) as client:
        register(client, tokens["agent"], 1)
        submit(client, tokens["user"], tokens["worker"])
        run = client.post(
            "/api/v1/agents/claim", json={"device_udid": "SIM-0000"}, headers=agent
        ).json()["run"]
        result = result_for(range(3), 40.0, udid="SIM-0000")

        def single(_: int) -> int:
            return client.post(
                f"/api/v1/runs/{run['run_id']}/results", json=result, headers=agent
            ).status_code

        def batched(_: int) -> int:
            body = {"uploads": [{"run_id": run["run_id"], "result": result}]}
            return client.post("/api/v1/agents/results", json=body, headers=agent).status_code

        with ThreadPoolExecutor(max_workers=16) as pool:
            statuses = list(pool.map(single, range(16))) + list(pool.map(batched, range(16)))
        assert set(statuses) == {200}, statuses

        nan = json.dumps(result).replace('"decode_tok_s": 40.0', '"decode_tok_s": NaN')
        refused = client.post(
            f"/api/v1/runs/{run['run_id']}/results",
            content=nan,
            headers={**agent, "content-type": "application/json"},
        )
        assert refused.status_code == 422 and "decode_tok_s" in refused.text
        garbage = client.post(
            f"/api/v1/runs/{run['run_id']}/results",
            content=b"{not json",
            headers={**agent, "content-type": "application/json"},
        )
        assert garbage.status_code == 422
        huge = client.post(
            f"/api/v1/runs/{run['run_id']}/results",
            content=b'{"prompts": [' + b"0," * (40 << 20) + b"0]}",
            headers={**agent, "content-type": "application/json"},
        )
        assert huge.status_code == 413
        unknown = client.post("/api/v1/runs/999999/results", json=result, headers=agent)
        assert unknown.status_code == 404

    stored = query(
        "SELECT prompt_index, decode_tok_s FROM prompt_results WHERE run_id = :run ORDER BY 1",
        run=run["run_id"],
    )
    assert stored == [(0, 40.0), (1, 41.0), (2, 42.0)]
    assert query("SELECT state FROM runs WHERE id = :run", run=run["run_id"]) == [("succeeded",)]
    stack.check_alive()
    log = (stack.var_dir / "server.log").read_text(errors="replace")
    assert " 500 " not in log and "Traceback" not in log
