"""Models users bring: files already in the artifact store, checked from their headers and
registered as one ``models`` row (or nothing, when any check fails)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from decodebench.checkpoints import check_gguf
from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.names import DEFAULT_FORMAT, FormatName
from decodebench.contracts.recipes import parse_recipe
from decodebench.contracts.uploads import (
    UPLOAD_PREFIX,
    ModelFileView,
    ModelKind,
    ModelRegistration,
    ModelView,
    upload_identity,
)
from decodebench.modelfiles import (
    TOKENIZER_FILES,
    ModelFileError,
    check_file_name,
    check_hf_checkpoint,
    check_json_file,
    check_package_zip,
    content_sha256,
    detect_kind,
)
from server import tenancy
from server.artifacts.store import ArtifactStore
from server.config import Settings
from server.errors import Conflict, InvalidInput, NotFound, TooLarge
from server.models import UserModel

MAX_SMALL_FILE = 64 * 2**20  # config and tokenizer files are read whole


def view(model: UserModel) -> ModelView:
    return ModelView(
        id=model.id,
        name=model.name,
        kind=ModelKind(model.kind),
        format=None if model.format is None else FormatName(model.format),
        architecture=model.architecture,
        content_sha256=model.content_sha256,
        total_bytes=model.total_bytes,
        files=[ModelFileView.model_validate(entry) for entry in model.files],
        summary=model.summary,
        created_by=model.created_by,
        created_at=model.created_at,
    )


def named_model(session: Session, name: str) -> UserModel | None:
    """The model of that name in any project: names are unique across the server."""
    return session.scalar(select(UserModel).where(UserModel.name == name))


def visible_model(session: Session, name: str) -> UserModel | None:
    """The model of that name if this session's project may see it (404 otherwise, as if it
    did not exist)."""
    return session.scalar(select(UserModel).where(UserModel.name == name, tenancy.models(session)))


def get_model(session: Session, name: str) -> UserModel:
    model = visible_model(session, name)
    if model is None:
        raise NotFound(f"no model {name!r}")
    return model


def list_models(session: Session, limit: int = 200) -> list[UserModel]:
    return list(
        session.scalars(
            select(UserModel)
            .where(tenancy.models(session))
            .order_by(UserModel.id.desc())
            .limit(limit)
        )
    )


def resolve_spec_model(session: Session, spec_model: str) -> UserModel | None:
    """The uploaded model a sweep's ``upload:<name>`` names (None for a preset); 422 when it is
    unknown or is a package, which a variant names instead."""
    if not spec_model.startswith(UPLOAD_PREFIX):
        return None
    name = spec_model.removeprefix(UPLOAD_PREFIX)
    model = visible_model(session, name)
    if model is None:
        raise InvalidInput(f"model: no uploaded model {name!r} (POST /api/v1/models first)")
    if model.kind == ModelKind.package:
        raise InvalidInput(
            f"model: {name!r} is a .mlpackage; name it in a variant's package field instead"
        )
    return model


def _stored(
    session: Session, store: ArtifactStore, request: ModelRegistration
) -> dict[str, tuple[str, Path]]:
    files: dict[str, tuple[str, Path]] = {}
    for index, ref in enumerate(request.files):
        where = f"files.{index} ({ref.path})"
        try:
            check_file_name(ref.path)
        except ModelFileError as error:
            raise InvalidInput(f"{where}: {error}") from None
        if ref.path in files:
            raise InvalidInput(f"{where}: the path is given twice")
        if not store.exists(ref.sha256) or not tenancy.artifact_visible(session, ref.sha256):
            raise InvalidInput(f"{where}: no finished upload with sha256 {ref.sha256}")
        files[ref.path] = (ref.sha256, store.path_for(ref.sha256))
    return files


def _check(kind: ModelKind, files: dict[str, tuple[str, Path]], settings: Settings) -> dict:
    """The summary of the files' headers; ModelFileError names what is wrong."""
    if kind == ModelKind.gguf:
        (name, (_, path)), *_ = files.items()
        with path.open("rb") as stream:
            return check_gguf(stream, path.stat().st_size, name)
    if kind == ModelKind.package:
        (name, (_, path)), *_ = files.items()
        return check_package_zip(path, name, settings.max_model_bytes)
    for name, (_, path) in files.items():
        if name == "config.json" or name.endswith(".safetensors"):
            continue
        if name not in TOKENIZER_FILES:
            raise ModelFileError(
                f"file {name!r} is not part of a checkpoint (config.json, *.safetensors, "
                f"{', '.join(sorted(TOKENIZER_FILES))})"
            )
        if name.endswith(".json"):
            if path.stat().st_size > MAX_SMALL_FILE:
                raise ModelFileError(f"{name}: over {MAX_SMALL_FILE} bytes for a tokenizer file")
            check_json_file(name, path.read_bytes())
    config_path = files["config.json"][1]
    if config_path.stat().st_size > MAX_SMALL_FILE:
        raise ModelFileError(f"config.json: over {MAX_SMALL_FILE} bytes")
    streams = {
        name: (path.open("rb"), path.stat().st_size)
        for name, (_, path) in files.items()
        if name.endswith(".safetensors")
    }
    try:
        return check_hf_checkpoint(config_path.read_bytes(), streams)
    finally:
        for stream, _ in streams.values():
            stream.close()


def register_model(
    session: Session,
    request: ModelRegistration,
    by: str,
    store: ArtifactStore,
    settings: Settings,
) -> tuple[UserModel, bool]:
    """The model and whether it was created (False: the same files under that name already)."""
    files = _stored(session, store, request)
    content = content_sha256((path, sha) for path, (sha, _) in files.items())
    project = tenancy.owner(session)
    existing = named_model(session, request.name)
    if existing is not None:
        return _same_or_conflict(existing, content, project), False
    total = sum(path.stat().st_size for _, path in files.values())
    if total > settings.max_model_bytes:
        raise TooLarge(
            f"files: {total} bytes together, over this server's limit of "
            f"{settings.max_model_bytes} per model (DECODEBENCH_MAX_MODEL_BYTES)"
        )
    try:
        detected = ModelKind(detect_kind(sorted(files)))
        if request.kind is not None and request.kind != detected:
            raise ModelFileError(f"kind: {request.kind.value} given, but the files are {detected}")
        if request.format is not None and detected != ModelKind.package:
            raise ModelFileError(
                f"format: only a package has a model format; the files are {detected}"
            )
        summary = _check(detected, files, settings)
    except ModelFileError as error:
        raise InvalidInput(str(error)) from None
    inserted = session.scalar(
        insert(UserModel)
        .values(
            name=request.name,
            kind=detected.value,
            format=(request.format or DEFAULT_FORMAT).value
            if detected == ModelKind.package
            else None,
            architecture=summary.get("architecture"),
            content_sha256=content,
            total_bytes=total,
            files=[
                {"path": name, "sha256": sha, "bytes": path.stat().st_size}
                for name, (sha, path) in sorted(files.items())
            ],
            summary=summary,
            created_by=by,
            project_id=project,
        )
        .on_conflict_do_nothing(index_elements=[UserModel.name])
        .returning(UserModel.id)
    )
    if inserted is None:  # registered concurrently under the same name
        raced = named_model(session, request.name)
        assert raced is not None
        return _same_or_conflict(raced, content, project), False
    return session.get_one(UserModel, inserted), True


def _same_or_conflict(existing: UserModel, content: str, project: int) -> UserModel:
    if existing.project_id != project:
        # Another project's model: say nothing of it but that the name is in use.
        raise Conflict(f"name: {existing.name!r} is taken on this server; choose another name")
    if existing.content_sha256 != content:
        raise Conflict(
            f"name: a model {existing.name!r} already exists with other files "
            f"(content {existing.content_sha256}); models are immutable, choose another name"
        )
    return existing


def variant_identities(session: Session, spec: SweepSpec) -> list[str]:
    """The model identity of each variant's build (what its key hashes), every uploaded model
    and package the spec names checked first: 422 naming the one that does not exist or fit."""
    model = resolve_spec_model(session, spec.model)
    layers = int(model.summary.get("num_layers", 0)) if model is not None else 0
    identities = []
    for index, variant in enumerate(spec.variants):
        package_content = None
        if variant.package is not None:
            package_content = _package(
                session, index, variant.package, variant.format
            ).content_sha256
        elif model is not None:
            if variant.layers is not None and variant.layers > layers:
                raise InvalidInput(
                    f"variants.{index}.layers ({variant.layers}) is more than the {layers} "
                    f"decoder layers {spec.model} has"
                )
            promoted = parse_recipe(variant.quant).promote_top
            if promoted > (variant.layers or layers):
                raise InvalidInput(
                    f"variants.{index}.quant promotes the top {promoted} layers but the model "
                    f"has {variant.layers or layers}"
                )
        identities.append(
            upload_identity(
                spec.model, model.content_sha256 if model is not None else None, package_content
            )
        )
    return identities


def _package(session: Session, index: int, name: str, variant_format: str) -> UserModel:
    package = visible_model(session, name)
    if package is None:
        raise InvalidInput(f"variants.{index}.package: no uploaded package {name!r}")
    if package.kind != ModelKind.package:
        raise InvalidInput(
            f"variants.{index}.package: {name!r} is a {package.kind} checkpoint, not a "
            ".mlpackage; name it as the sweep's model (upload:{name})"
        )
    if package.format != variant_format:
        raise InvalidInput(
            f"variants.{index}.package: {name!r} is a {package.format} package, the variant's "
            f"format is {variant_format}"
        )
    return package
