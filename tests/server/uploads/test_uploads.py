"""Uploads and models over the API: chunks at offsets, resume, checksum, header checks that name
the file and tensor at fault, limits (413), and sweeps naming what does not exist (422)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from decodebench.contracts.presets import TINY_LLAMA
from tests.support.api import bearer, make_token, project_token
from tests.support.services import table_counts
from tests.support.uploads import register

pytest.importorskip("transformers")


def folder_files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


def rewrite_header(data: bytes, change) -> bytes:
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    change(header)
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data[8 + length :]


def test_chunks_at_offsets_resume_and_register_a_model(api, user_token, tiny_llama_folder) -> None:
    headers = bearer(user_token)
    data = (tiny_llama_folder / "model.safetensors").read_bytes()
    upload = api.post(
        "/api/v1/uploads",
        json={"filename": "model.safetensors", "size": len(data)},
        headers=headers,
    ).json()
    url = f"/api/v1/uploads/{upload['id']}"
    assert (
        api.put(url, params={"offset": 0}, content=data[:1000], headers=headers).json()["offset"]
        == 1000
    )
    # An interrupted client asks where it stopped, and a chunk sent from elsewhere is refused.
    assert api.get(url, headers=headers).json()["offset"] == 1000
    stale = api.put(url, params={"offset": 0}, content=data[:1000], headers=headers)
    assert stale.status_code == 409 and "at byte 1000, not 0" in stale.json()["detail"]
    # Finishing early is refused; a wrong checksum resets the upload to offset 0.
    early = api.post(f"{url}/finish", json={"sha256": "0" * 64}, headers=headers)
    assert early.status_code == 409 and f"1000 of its {len(data)} bytes" in early.json()["detail"]
    api.put(url, params={"offset": 1000}, content=data[1000:], headers=headers)
    wrong = api.post(f"{url}/finish", json={"sha256": "0" * 64}, headers=headers)
    assert wrong.status_code == 422 and "reset to offset 0" in wrong.json()["detail"]
    assert api.get(url, headers=headers).json()["offset"] == 0
    api.put(url, params={"offset": 0}, content=data, headers=headers)
    sha256 = hashlib.sha256(data).hexdigest()
    done = api.post(f"{url}/finish", json={"sha256": sha256}, headers=headers).json()
    assert done["state"] == "finished" and done["sha256"] == sha256
    assert api.get(f"/api/v1/artifacts/{sha256}", headers=headers).content == data
    # Someone else's upload does not exist for them.
    other = make_token("user", "someone-else")
    assert api.get(url, headers=bearer(other)).status_code == 404

    files = folder_files(tiny_llama_folder)
    created = register(api, user_token, "tiny", files)
    assert created.status_code == 201, created.text
    model = created.json()
    assert model["kind"] == "hf" and model["architecture"] == "LlamaForCausalLM"
    assert model["summary"]["num_layers"] == TINY_LLAMA.num_layers
    assert {entry["path"] for entry in model["files"]} == set(files)
    assert model["total_bytes"] == sum(len(data) for data in files.values())
    again = register(api, user_token, "tiny", files)
    assert again.status_code == 200 and again.json()["id"] == model["id"]
    other_files = {**files, "config.json": files["config.json"].replace(b"{", b'{"x": 1,', 1)}
    taken = register(api, user_token, "tiny", other_files)
    assert taken.status_code == 409 and "already exists with other files" in taken.json()["detail"]
    assert [m["name"] for m in api.get("/api/v1/models", headers=headers).json()] == ["tiny"]
    assert (
        api.get("/api/v1/models/tiny", headers=headers).json()["content_sha256"]
        == model["content_sha256"]
    )


def test_corrupt_safetensors_are_refused_naming_the_tensor(
    api, user_token, tiny_llama_folder
) -> None:
    files = folder_files(tiny_llama_folder)
    data = files["model.safetensors"]
    victim = "model.layers.1.self_attn.k_proj.weight"

    def widen(header: dict) -> None:
        header[victim]["shape"][1] += 1

    cases = {
        "wrong shape for its bytes": (rewrite_header(data, widen), victim),
        "truncated": (data[:-100], None),
        "not safetensors": (b"\xff" * 64, "header length"),
    }
    for what, (corrupt, named) in cases.items():
        refused = register(api, user_token, "broken", {**files, "model.safetensors": corrupt})
        assert refused.status_code == 422, what
        detail = refused.json()["detail"]
        assert detail.startswith("model.safetensors"), detail
        if named is None:  # truncation: the tensor whose data runs past the end is named
            assert "tensor model." in detail and "truncated" in detail, detail
        else:
            assert named in detail, detail
    missing = register(api, user_token, "broken", {"config.json": files["config.json"]})
    assert missing.status_code == 422 and "no *.safetensors" in missing.json()["detail"]
    unsupported = json.loads(files["config.json"])
    unsupported["architectures"] = ["GPT2LMHeadModel"]
    refused = register(
        api, user_token, "broken", {**files, "config.json": json.dumps(unsupported).encode()}
    )
    assert refused.status_code == 422 and "GPT2LMHeadModel" in refused.json()["detail"]
    assert table_counts()["models"] == 0


def test_limits_and_unknown_names(api, user_token, monkeypatch) -> None:
    from server.config import get_settings

    headers = bearer(user_token)
    monkeypatch.setattr(get_settings(), "max_upload_bytes", 4096)
    big = api.post("/api/v1/uploads", json={"filename": "x.gguf", "size": 4097}, headers=headers)
    assert big.status_code == 413 and "DECODEBENCH_MAX_UPLOAD_BYTES" in big.json()["detail"]
    upload = api.post(
        "/api/v1/uploads", json={"filename": "x.gguf", "size": 10}, headers=headers
    ).json()
    past = api.put(
        f"/api/v1/uploads/{upload['id']}", params={"offset": 0}, content=b"x" * 11, headers=headers
    )
    assert past.status_code == 413 and "declared size of 10" in past.json()["detail"]
    ghost = api.post(
        "/api/v1/models",
        json={"name": "ghost", "files": [{"path": "x.gguf", "sha256": "a" * 64}]},
        headers=headers,
    )
    assert ghost.status_code == 422 and "no finished upload" in ghost.json()["detail"]
    not_gguf = register(api, user_token, "fake", {"x.gguf": b"GGUF" + b"\x09\x00\x00\x00"})
    assert not_gguf.status_code == 422 and "GGUF version 9" in not_gguf.json()["detail"]
    before = table_counts()
    sweep = {"model": "upload:nobody", "variants": [{}], "devices": ["iphone-17-pro"]}
    unknown = api.post("/api/v1/sweeps", json=sweep, headers=headers)
    assert unknown.status_code == 422 and "'nobody'" in unknown.json()["detail"]
    sweep = {
        "model": "tiny-gqa",
        "variants": [{"package": "nothing"}],
        "devices": ["iphone-17-pro"],
    }
    unknown = api.post("/api/v1/sweeps", json=sweep, headers=headers)
    assert unknown.status_code == 422 and "variants.0.package" in unknown.json()["detail"]
    sweep["variants"] = [{"package": "nothing", "attention": "repeat_kv"}]
    mixed = api.post("/api/v1/sweeps", json=sweep, headers=headers)
    assert mixed.status_code == 422 and "leave out attention" in json.dumps(mixed.json())
    assert table_counts() == before


def _gguf(architecture: str, *, truncate: int = 0) -> bytes:
    """A GGUF header whose architecture comes after a string array and a number array (the
    reader skips both)."""

    def text(value: str) -> bytes:
        return struct.pack("<Q", len(value.encode())) + value.encode()

    kvs = [
        text("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + text("a") + text("bc"),
        text("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, 3) + b"\0" * 12,
        text("general.architecture") + struct.pack("<I", 8) + text(architecture),
    ]
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    return data[: len(data) - truncate]


def test_gguf_and_package_archives_are_checked(tmp_path: Path) -> None:
    import io
    import zipfile

    from decodebench.checkpoints import check_gguf
    from decodebench.modelfiles import ModelFileError, check_json_file, check_package_zip

    with pytest.raises(ModelFileError, match="tokenizer.json: not JSON"):
        check_json_file("tokenizer.json", b"[" * 100_000)  # a RecursionError, not a 500

    def gguf(data: bytes) -> dict:
        return check_gguf(io.BytesIO(data), len(data), "m.gguf")

    assert gguf(_gguf("llama"))["architecture"] == "llama"
    with pytest.raises(ModelFileError, match="'gpt2' is not supported"):
        gguf(_gguf("gpt2"))
    with pytest.raises(ModelFileError, match="runs past the end"):
        gguf(_gguf("llama", truncate=3))

    def package(entries: dict[str, bytes], limit: int = 10_000) -> dict:
        path = tmp_path / "p.zip"
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in entries.items():
                archive.writestr(name, data)
        return check_package_zip(path, "p.zip", limit)

    good = {"m.mlpackage/Manifest.json": b"{}", "m.mlpackage/Data/w.bin": b"0" * 100}
    assert package(good)["manifest"] == "m.mlpackage/Manifest.json"
    with pytest.raises(ModelFileError, match="escapes"):
        package({**good, "../evil": b"x"})
    with pytest.raises(ModelFileError, match="exactly one"):
        package({**good, "n.mlpackage/Manifest.json": b"{}"})
    with pytest.raises(ModelFileError, match="DECODEBENCH_MAX_MODEL_BYTES"):
        package(good, limit=50)


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    """Two requests writing the same upload at once: the second is told 409, not interleaved."""
    import asyncio

    from server.artifacts.store import ArtifactStore
    from server.errors import Conflict
    from server.uploads.service import partial_path, write_chunk

    store = ArtifactStore(tmp_path)
    partial_path(store, "a" * 32).parent.mkdir(parents=True)
    partial_path(store, "a" * 32).touch()

    async def scenario() -> int:
        release = asyncio.Event()

        async def slow():
            yield b"x" * 10
            await release.wait()
            yield b"y" * 10

        async def other():
            yield b"z"

        first = asyncio.create_task(write_chunk(store, "a" * 32, 100, 0, slow()))
        await asyncio.sleep(0.05)
        with pytest.raises(Conflict, match="another request is writing"):
            await write_chunk(store, "a" * 32, 100, 0, other())
        release.set()
        return await first

    assert asyncio.run(scenario()) == 20
    assert partial_path(store, "a" * 32).read_bytes() == b"x" * 10 + b"y" * 10


def test_idle_open_uploads_are_pruned(api, user_token) -> None:
    import os
    import time

    from server.artifacts.store import ArtifactStore
    from server.config import get_settings
    from server.manage import prune_uploads_command
    from server.uploads.service import partial_path

    headers = bearer(user_token)
    ids = [
        api.post(
            "/api/v1/uploads", json={"filename": "a.gguf", "size": 10}, headers=headers
        ).json()["id"]
        for _ in range(2)
    ]
    api.put(f"/api/v1/uploads/{ids[0]}", params={"offset": 0}, content=b"abc", headers=headers)
    stale = partial_path(ArtifactStore(get_settings().artifact_dir), ids[0])
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert prune_uploads_command(idle_hours=1.0) == 1
    assert not stale.exists()
    assert api.get(f"/api/v1/uploads/{ids[0]}", headers=headers).status_code == 404
    assert api.get(f"/api/v1/uploads/{ids[1]}", headers=headers).json()["offset"] == 0


def test_a_package_that_cannot_be_read_fails_its_build_naming_it(tmp_path: Path) -> None:
    from decodebench.building.build import BuildError, build
    from decodebench.building.sources import PackageSource, PresetSource
    from decodebench.contracts.domain import VariantSpec

    package = tmp_path / "x.mlpackage"
    package.mkdir()
    (package / "Manifest.json").write_text("{}")
    variant = VariantSpec(package="mine", context=128)
    with pytest.raises(BuildError, match="^package mine: "):
        build(
            PackageSource(PresetSource(TINY_LLAMA.name), package, "id"), variant, tmp_path / "out"
        )


def test_another_projects_models_and_files_do_not_exist_for_a_token(
    api, user_token, tiny_llama_folder
) -> None:
    """A model belongs to the project that brought it: another project's token finds nothing
    of it (404 and empty lists), cannot use it in a sweep, download its files or register
    them by their hashes; the name stays taken across the server (409, nothing more said)."""
    files = folder_files(tiny_llama_folder)
    assert register(api, user_token, "mine", files).status_code == 201
    model = api.get("/api/v1/models/mine", headers=bearer(user_token)).json()
    outsider = project_token("elsewhere", "outsider")
    other = bearer(outsider)

    assert api.get("/api/v1/models", headers=other).json() == []
    assert api.get("/api/v1/models/mine", headers=other).status_code == 404
    for entry in model["files"]:
        assert api.get(f"/api/v1/artifacts/{entry['sha256']}", headers=other).status_code == 404
    spec = {"model": "upload:mine", "variants": [{"attention": "folded"}],
            "devices": ["iphone-17-pro"]}  # fmt: skip
    refused = api.post("/api/v1/sweeps", json=spec, headers=other)
    assert refused.status_code == 422 and "no uploaded model 'mine'" in refused.json()["detail"]
    by_hash = [{"path": e["path"], "sha256": e["sha256"]} for e in model["files"]]
    stolen = api.post("/api/v1/models", json={"name": "copy", "files": by_hash}, headers=other)
    assert stolen.status_code == 422 and "no finished upload" in stolen.json()["detail"]
    taken = register(api, outsider, "mine", files)
    assert taken.status_code == 409 and "taken" in taken.json()["detail"]
    assert model["content_sha256"] not in taken.text
    # The same files uploaded by the other project are its own: it may register them anew.
    assert api.get("/api/v1/models", headers=other).json() == []
    assert register(api, outsider, "theirs", files).status_code == 201
    assert [m["name"] for m in api.get("/api/v1/models", headers=bearer(user_token)).json()] == [
        "mine"
    ]
