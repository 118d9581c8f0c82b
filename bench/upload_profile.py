"""Where an upload's time goes: the server's work for one 30-prompt `RunResult`, in-process.

    python -m bench.upload_profile --json [--uploads 60]

Creates its own database, completes builds and claims runs through the app (as
bench/ingest.py does), then times the upload's service work without HTTP — the token and agent
lookups, ``record_results``, the commit and the settle check after it — one upload at a time,
with every SQL statement timed. Prints one JSON object: milliseconds per upload, statements per
upload, and the statements that took longest (milliseconds per upload each).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

from scripts.stack import scratch_database


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--uploads", type=int, default=60)
    parser.add_argument("--database", default="decodebench_bench_upload_profile")
    args = parser.parse_args()
    with scratch_database(args.database) as database_url:
        os.environ["DECODEBENCH_DATABASE_URL"] = database_url
        os.environ["DECODEBENCH_BROKER_URL"] = "memory://"
        os.environ["DECODEBENCH_ARTIFACT_DIR"] = tempfile.mkdtemp(prefix="bench-upload-")
        try:
            figures = profile(args.uploads)
        finally:
            from server.db import get_engine

            get_engine().dispose()  # before the database is dropped
    print(json.dumps(figures) if args.json else json.dumps(figures, indent=2))


def profile(uploads: int) -> dict:
    from fastapi.testclient import TestClient
    from sqlalchemy import event

    from bench import ingest
    from decodebench.contracts.results import RunResult
    from server import tenancy
    from server.agents import service as agents
    from server.app import app
    from server.auth import lookup_token
    from server.db import commit_with_follow_ups, get_engine, get_sessionmaker
    from server.manage import create_token_command, migrate
    from server.runs import results as runs

    migrate()
    tokens = {kind: create_token_command(kind, f"bench-{kind}", None) for kind in
              ("user", "worker", "agent")}  # fmt: skip
    claimed = []
    with TestClient(app) as client:
        user, agent = ({"Authorization": f"Bearer {tokens[k]}"} for k in ("user", "agent"))
        for index in range(-(-uploads // ingest.RUNS_PER_SWEEP)):
            sweep = client.post("/api/v1/sweeps", json=ingest.SPEC, headers=user).json()
            if index == 0:
                ingest.complete_builds(client, sweep["builds"], tokens["worker"])
        inventory = [{"udid": ingest.udid(i), "device_class": ingest.DEVICE_CLASS,
                      "product_type": "iPhone18,1", "driver": "simulated", "simulated": True}
                     for i in range(uploads)]  # fmt: skip
        registered = client.post("/api/v1/agents/register", headers=agent,
                                 json={"name": "bench", "devices": inventory})  # fmt: skip
        registered.raise_for_status()
        for i in range(uploads):
            run = client.post("/api/v1/agents/claim", json={"device_udid": ingest.udid(i)},
                              headers=agent).json()["run"]  # fmt: skip
            body = ingest.run_result(ingest.udid(i), run["decode_tokens"])
            claimed.append((run["run_id"], RunResult.model_validate(body)))

    statements: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def before(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        conn.info["started"] = time.perf_counter()

    def after(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        tally = statements[" ".join(statement.split())[:80]]
        tally[0] += 1
        tally[1] += time.perf_counter() - conn.info["started"]

    event.listen(get_engine(), "before_cursor_execute", before)
    event.listen(get_engine(), "after_cursor_execute", after)
    started = time.perf_counter()
    for run_id, result in claimed:
        session = get_sessionmaker()()
        try:
            token = lookup_token(session, tokens["agent"])
            assert token is not None
            tenancy.bind(session, token)
            owner = agents.agent_for_token(session, token)
            runs.record_results(session, run_id, owner.id, result)
            commit_with_follow_ups(session)
        finally:
            session.close()
    elapsed = time.perf_counter() - started
    slowest = sorted(statements.items(), key=lambda item: -item[1][1])[:8]
    return {
        "uploads": uploads,
        "prompts_per_upload": ingest.PROMPTS,
        "ms_per_upload": round(elapsed / uploads * 1000, 1),
        "statements_per_upload": round(sum(n for n, _ in statements.values()) / uploads, 1),
        "sql_ms_per_upload": round(sum(s for _, s in statements.values()) / uploads * 1000, 1),
        "slowest": {key: round(seconds / uploads * 1000, 2) for key, (_, seconds) in slowest},
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


if __name__ == "__main__":
    main()
