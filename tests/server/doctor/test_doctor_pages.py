"""The doctor pages in-process: the form starts a job (or says what is wrong, writing nothing),
the report page shows progress while the job waits, and another project's job is not found."""

from __future__ import annotations

import re

import pytest

from tests.support.api import project_token
from tests.support.doctor_jobs import massive_channel_package, zipped
from tests.support.pages import page_csrf, ui_sign_in
from tests.support.services import query
from tests.support.uploads import register

pytest.importorskip("coremltools")


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("doctor-pages")
    return zipped(massive_channel_package(root), root)


def test_the_form_starts_a_job_and_its_page_shows_progress(api, user_token, archive) -> None:
    assert (
        register(api, user_token, "massive", {archive.name: archive.read_bytes()}).status_code
        == 201
    )
    ui_sign_in(api, user_token)
    form = api.get("/doctor").text
    assert '<option value="massive">massive</option>' in form
    fields = {"package": "massive", "tokenizer": "smollm2-135m", "prompts": "2", "steps": "4"}

    refused = api.post("/doctor", data={**fields, "devices": [], "csrf_token": page_csrf(form)})
    assert refused.status_code == 422 and "devices" in refused.text
    refused = api.post(
        "/doctor",
        data={
            **fields,
            "steps": "four",
            "devices": ["iphone-17-pro"],
            "csrf_token": page_csrf(form),
        },
    )
    assert refused.status_code == 422 and "steps" in refused.text
    assert query("SELECT id FROM doctor_jobs") == []

    started = api.post(
        "/doctor",
        data={
            **fields,
            "devices": ["iphone-16-pro", "iphone-17-pro"],
            "csrf_token": page_csrf(form),
        },
        follow_redirects=False,
    )
    assert started.status_code == 303, started.text
    location = started.headers["location"]
    assert re.fullmatch(r"/doctor/\d+", location)
    page = api.get(location).text
    assert 'http-equiv="refresh"' in page and 'id="doctor-progress"' in page
    assert "waiting for a worker" in page and "A/B sweep" in page
    assert api.get(f"{location}/download").status_code == 409

    other = project_token("elsewhere", "them")
    api.cookies.clear()
    ui_sign_in(api, other)
    assert api.get(location).status_code == 404
