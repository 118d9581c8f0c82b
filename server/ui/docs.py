"""The API documentation, served with Swagger UI's own files from the swagger-ui-bundle
package: /docs works without internet and without inline script."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from server.ui.security import CONTENT_SECURITY_POLICY

router = APIRouter(include_in_schema=False)

# Swagger UI sets style attributes on its own elements; only /docs allows that.
DOCS_POLICY = CONTENT_SECURITY_POLICY.replace(
    "style-src 'self'", "style-src 'self' 'unsafe-inline'"
)

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>decodebench API</title>
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head><body><main id="swagger-ui"></main>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/static/docs.js"></script>
</body></html>"""


@router.get("/docs", response_class=HTMLResponse)
def docs() -> HTMLResponse:
    return HTMLResponse(_PAGE, headers={"Content-Security-Policy": DOCS_POLICY})


def mount_docs(app: FastAPI) -> None:
    app.mount("/docs/assets", StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")
    app.include_router(router)
