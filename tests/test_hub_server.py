"""The local hub answers huggingface_hub the way the real hub does, errors included."""

from __future__ import annotations

import hashlib

import pytest

from tests.hub_server import LocalHub

pytestmark = pytest.mark.preflight

GOOD, UNAPPROVED, BAD = "hf_good_token_0001", "hf_unapproved_0002", "hf_not_a_token_0003"


@pytest.fixture
def hub(monkeypatch):
    with LocalHub() as hub:
        hub.valid_tokens |= {GOOD, UNAPPROVED}
        hub.add_repo("org/public", {"config.json": b'{"a": 1}', "model.safetensors": b"x" * 5000})
        hub.add_repo("org/gated", {"config.json": b"{}"}, gated=True, approved_tokens={GOOD})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield hub


def api():
    # Imported after HF_ENDPOINT is set: huggingface_hub reads it at import time.
    import importlib

    import huggingface_hub
    from huggingface_hub import constants

    importlib.reload(constants)
    return huggingface_hub, huggingface_hub.HfApi(endpoint=constants.ENDPOINT)


def test_auth_check_cases(hub):
    _hf, client = api()
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    client.auth_check("org/public")
    client.auth_check("org/gated", token=GOOD)
    with pytest.raises(GatedRepoError):
        client.auth_check("org/gated", token=False)
    with pytest.raises(GatedRepoError) as unapproved:
        client.auth_check("org/gated", token=UNAPPROVED)
    assert unapproved.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as bad:
        client.auth_check("org/gated", token=BAD)
    assert bad.value.response.status_code == 401
    assert not isinstance(bad.value, RepositoryNotFoundError)
    with pytest.raises(RepositoryNotFoundError) as missing:
        client.auth_check("org/missing")
    assert not isinstance(missing.value, GatedRepoError)


def test_model_info_with_file_metadata(hub):
    _hf, client = api()
    info = client.model_info("org/public", files_metadata=True)
    assert len(info.sha) == 40
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes == {"config.json": 8, "model.safetensors": 5000}
    weights = next(s for s in info.siblings if s.rfilename == "model.safetensors")
    assert weights.lfs.sha256 == hashlib.sha256(b"x" * 5000).hexdigest()
    pinned = client.model_info("org/public", revision=info.sha, files_metadata=True)
    assert pinned.sha == info.sha
    from huggingface_hub.errors import RevisionNotFoundError

    with pytest.raises(RevisionNotFoundError):
        client.model_info("org/public", revision="0" * 40)


def test_snapshot_download_and_request_log(hub, tmp_path):
    hf, _client = api()
    target = tmp_path / "public"
    hf.snapshot_download("org/public", local_dir=target)
    assert (target / "model.safetensors").read_bytes() == b"x" * 5000
    fetched = [r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path]
    assert len(fetched) == 2
    assert all(not r.authenticated for r in hub.requests)
