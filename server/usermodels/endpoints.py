"""``/api/v1/models``: register, list and read the models users bring."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from decodebench.contracts.uploads import ModelRegistration, ModelView
from server.artifacts.endpoints import StoreDep
from server.auth import AnyToken, SessionDep, SubmitToken, UserToken
from server.config import get_settings
from server.errors import AUTHENTICATED_ERRORS
from server.usermodels import service

router = APIRouter(prefix="/api/v1/models", tags=["models"], responses=AUTHENTICATED_ERRORS)

ModelName = Annotated[
    str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$", description="The model's name")
]


@router.post("", status_code=201, response_model=ModelView, responses={200: {"model": ModelView}})
def register_model(
    request: ModelRegistration,
    token: SubmitToken,
    session: SessionDep,
    store: StoreDep,
    response: Response,
) -> ModelView:
    """Register uploaded files as a model, checked from their headers: 201, or 200 when the same
    files are registered under that name already; 409 for other files under that name; 422
    naming the file (and tensor) at fault; 413 over DECODEBENCH_MAX_MODEL_BYTES."""
    model, created = service.register_model(session, request, token.name, store, get_settings())
    if not created:
        response.status_code = 200
    session.flush()
    session.refresh(model)
    return service.view(model)


@router.get("", response_model=list[ModelView])
def list_models(token: UserToken, session: SessionDep) -> list[ModelView]:
    return [service.view(model) for model in service.list_models(session)]


@router.get("/{name}", response_model=ModelView)
def get_model(name: ModelName, token: AnyToken, session: SessionDep) -> ModelView:
    """A model and its files (workers read it to fetch the files from the artifact store)."""
    return service.view(service.get_model(session, name))
