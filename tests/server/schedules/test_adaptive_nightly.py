"""Adaptive nightlies through the API (in-process server, real PostgreSQL): the spread learned
from stored repeated runs, runs added to a night that cannot decide until the schedule's budget
is spent (and said so), and the minimum detectable effect on the series and the nightly page."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest

from tests.support.api import bearer
from tests.support.pages import ui_sign_in
from tests.support.schedules import FIRST_NIGHT, NIGHTLY_SPEC
from tests.support.sweeps import finish_builds, register, result_for, submit


@pytest.fixture(autouse=True)
def _no_schedules(db: None) -> None:
    """The shared fixtures truncate the sweep tables; schedules and spreads are cleared here."""
    from sqlalchemy import text

    from server.db import get_engine

    with get_engine().begin() as connection:
        connection.execute(text("TRUNCATE schedules, device_spreads RESTART IDENTITY CASCADE"))


def _claim(api, agent_token: str) -> dict | None:
    response = api.post(
        "/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=bearer(agent_token)
    )
    assert response.status_code == 200, response.text
    return response.json()["run"]


def _post(api, agent_token: str, run: dict, rate: float) -> None:
    # result_for adds the prompt index to each prompt's rate: the run's mean is `rate`.
    prompts = run["prompts"]
    response = api.post(
        f"/api/v1/runs/{run['run_id']}/results",
        json=result_for(range(prompts), rate - (prompts - 1) / 2),
        headers=bearer(agent_token),
    )
    assert response.status_code == 200, response.text


def _store_nights(template_id: int, nights: int, runs: int, run_sd: float, night_sd: float) -> None:
    """``nights`` completed copies of sweep ``template_id`` (same build, same phone) with
    ``runs`` succeeded runs each, stored as an agent's results would be: every run's rate is
    1300 tok/s x a night offset (sd ``night_sd``) x a run offset (sd ``run_sd``)."""
    from server.db import get_sessionmaker
    from server.models import PromptResultRow, Run, Sweep, SweepVariant

    rng = np.random.default_rng(20261203)
    with get_sessionmaker()() as session, session.begin():
        template = session.get_one(Sweep, template_id)
        variant = template.variants[0]
        for _ in range(nights):
            sweep = Sweep(model=template.model, spec=template.spec, state="completed",
                          submitted_by="stored", project_id=template.project_id)  # fmt: skip
            sweep.variants = [SweepVariant(position=0, label=variant.label,
                                           variant=variant.variant, build_id=variant.build_id)]  # fmt: skip
            session.add(sweep)
            session.flush()
            night = 1300.0 * math.exp(rng.normal(0, night_sd))
            for repetition in range(runs):
                run = Run(sweep_id=sweep.id, sweep_variant_id=sweep.variants[0].id,
                          build_id=variant.build_id, device_class="iphone-17-pro",
                          repetition=repetition, state="succeeded", device_udid="SIM-0001",
                          summary={"peak_memory_bytes": 1})  # fmt: skip
                session.add(run)
                session.flush()
                rate = night * math.exp(rng.normal(0, run_sd))
                session.add_all(
                    PromptResultRow(
                        run_id=run.id,
                        prompt_index=index,
                        prompt_tokens=5,
                        generated_tokens=2,
                        ttft_ms=3.0,
                        prefill_tok_s=100.0,
                        decode_tok_s=rate,
                        token_latencies_ms=[1.0, 1.0],
                        simulated=True,
                    )  # fmt: skip
                    for index in range(3)
                )


def test_the_spread_is_learned_from_stored_repeated_runs_within_20_percent(
    api, user_token: str, worker_token: str
) -> None:
    """120 stored nights of one build x 3 runs on one phone, with a night-to-night spread of 4%
    and a run-to-run spread of 1.5%, are learned back within 20% (the runs are written to
    PostgreSQL as results are; the learning and the page read them as they read any)."""
    template = submit(api, user_token, worker_token, variants=[{"attention": "folded"}])
    run_sd, night_sd = 0.015, 0.04
    _store_nights(template, 120, 3, run_sd, night_sd)

    user = bearer(user_token)
    assert api.get("/api/v1/profiles/iphone-17-pro/spread", headers=user).status_code == 404
    learned = api.post("/api/v1/profiles/iphone-17-pro/spread", headers=user).json()

    assert learned["run_spread"] == pytest.approx(run_sd, rel=0.2)
    assert learned["night_spread"] == pytest.approx(night_sd, rel=0.2)
    assert (learned["runs"], learned["nights"]) == (360, 120)
    assert api.get("/api/v1/profiles/iphone-17-pro/spread", headers=user).json() == learned
    ui_sign_in(api, user_token, "/profiles")
    page = api.get("/profiles").text
    assert f"{learned['run_spread'] * 100:.2f}%" in page and "360 runs in 120 groups" in page


def _tick(api, worker_token: str, now) -> dict:
    response = api.post(
        "/api/v1/schedules/tick", json={"now": now.isoformat()}, headers=bearer(worker_token)
    )
    assert response.status_code == 200, response.text
    return response.json()


def _night(api, tokens: dict, night: int, rates: list[float]) -> int:
    """Fire night ``night``, measure each run it (and its added rounds) asks for at the next of
    ``rates``, tick until the night is judged; the runs it took."""
    now = FIRST_NIGHT + timedelta(days=night)
    assert len(_tick(api, tokens["worker"], now)["fired"]) == 1
    firing = api.get("/api/v1/schedules/1/firings", headers=bearer(tokens["user"])).json()[-1]
    sweep = api.get(f"/api/v1/sweeps/{firing['sweep_id']}", headers=bearer(tokens["user"])).json()
    if any(build["state"] != "succeeded" for build in sweep["builds"]):
        finish_builds(api, sweep, tokens["worker"])
    taken = 0
    for minute in range(1, 20):
        while (run := _claim(api, tokens["agent"])) is not None:
            _post(api, tokens["agent"], run, rates[taken])
            taken += 1
        if _tick(api, tokens["worker"], now + timedelta(minutes=minute))["completed"]:
            return taken
    raise AssertionError(f"night {night} was not judged")


def test_a_night_adds_runs_until_its_budget_is_spent_and_says_so_and_the_mde_is_shown(
    api, user_token: str, worker_token: str, agent_token: str
) -> None:
    tokens = {"user": user_token, "worker": worker_token, "agent": agent_token}
    user = bearer(user_token)
    register(api, agent_token, 2)
    body = {"name": "nightly-budget", "spec": NIGHTLY_SPEC, "cron": "0 2 * * *", "budget": 4}
    created = api.post("/api/v1/schedules", json=body, headers=user)
    assert created.status_code == 201 and created.json()["budget"] == 4
    # Three quiet nights of two runs 6% apart: a run-to-run spread of about 4%.
    for night in range(3):
        assert _night(api, tokens, night, [1030.0, 970.0]) == 2
    # Night 4 is 4.5% slower: beyond min_effect (2%) and one standard error, inside its
    # interval at 2 runs and at 4, so it asks for a round of 2 more runs, then spends its budget.
    assert _night(api, tokens, 3, [955.0] * 8) == 4

    series = api.get("/api/v1/schedules/1/series", headers=user).json()[0]
    assert [value["runs"] for value in series["values"]] == [2, 2, 2, 4]
    assert series["values"][1]["adaptive"].startswith("decided")
    assert series["values"][3]["adaptive"].startswith("budget spent: budget of 4 runs spent")
    assert series["values"][3]["mean"] == pytest.approx(955.0, abs=1)
    sweeps = api.get("/api/v1/sweeps", headers=user).json()
    assert len(sweeps) == 5  # four nights and one round of added runs, on the same build
    assert sum("(added runs)" in sweep["submitted_by"] for sweep in sweeps) == 1

    spread, detectable = series["spread"], series["detectable"]
    assert spread["run_spread"] == pytest.approx(0.04, rel=0.25)
    assert detectable["effect"] > detectable["min_effect"] == 0.02
    assert "above min_effect 2.0%" in detectable["warning"]
    ui_sign_in(api, user_token, "/schedules/1")
    page = api.get("/schedules/1").text
    assert (
        f"{detectable['effect'] * 100:.1f}% at {detectable['runs_per_night']} runs a night" in page
    )
    assert "Warning: the smallest step confirmable" in page
    assert "budget spent" in page


def test_stand_in_devices_draw_the_learned_run_spread_when_the_spec_asks(
    api, user_token: str, worker_token: str, agent_token: str
) -> None:
    from server.db import get_sessionmaker
    from server.models import DeviceSpread, Sweep

    register(api, agent_token, 2)
    asked = submit(api, user_token, worker_token, learned_noise=True)
    with get_sessionmaker()() as session, session.begin():
        project_id = session.get_one(Sweep, asked).project_id
        session.add(DeviceSpread(project_id=project_id, device_class="iphone-17-pro",
                                 run_spread=0.047, night_spread=0.01, runs=96, nights=24))  # fmt: skip

    learned = _claim(api, agent_token)
    assert learned is not None and learned["sweep_id"] == asked
    noise = learned["device_profile"]["noise"]
    assert noise["run_spread"] == 0.047 and "learned from 96 stored runs" in noise["source"]
    _post(api, agent_token, learned, 1000.0)
    while (run := _claim(api, agent_token)) is not None:
        _post(api, agent_token, run, 1000.0)
    submit(api, user_token, worker_token)  # not asked: the profile's assumed spread
    assumed = _claim(api, agent_token)
    assert assumed is not None and assumed["device_profile"]["noise"]["run_spread"] == 0.01
