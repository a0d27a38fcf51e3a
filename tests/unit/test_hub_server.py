"""The local hub answers huggingface_hub the way the real hub does, errors and redirects
included, and its storage origin is as strict as a presigned-URL store."""

from __future__ import annotations

import hashlib
import os
from urllib.parse import urlsplit

import httpx2
import pytest

from tests.support.hub_server import LocalHub, Stall

pytestmark = pytest.mark.preflight

GOOD, UNAPPROVED, BAD = "hf_good_token_0001", "hf_unapproved_0002", "hf_not_a_token_0003"
# Larger than two of huggingface_hub's 10 MiB read chunks: it resumes at a chunk boundary.
GATED_WEIGHTS = os.urandom(24 << 20)


@pytest.fixture
def hub(monkeypatch):
    with LocalHub() as hub:
        hub.valid_tokens |= {GOOD, UNAPPROVED}
        hub.add_repo("org/public", {"config.json": b'{"a": 1}', "model.safetensors": b"x" * 5000})
        hub.add_repo(
            "org/gated",
            {"config.json": b"{}", "weights.safetensors": GATED_WEIGHTS},
            gated=True,
            approved_tokens={GOOD},
        )
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        # Left alone on purpose: the hub offers no xet, so huggingface_hub uses plain HTTP.
        monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield hub


def api():
    # Imported after HF_ENDPOINT is set: huggingface_hub reads it at import time.
    import importlib

    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    importlib.reload(constants)
    importlib.reload(_http)  # its set of hub origins (where the token may go) is built at import
    return huggingface_hub, huggingface_hub.HfApi(endpoint=constants.ENDPOINT)


def resolve_url(hub: LocalHub, repo: str, name: str) -> str:
    return f"{hub.url}/{repo}/resolve/{hub.repos[repo].sha}/{name}"


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


def test_lfs_file_is_a_redirect_carrying_its_metadata(hub):
    """What huggingface_hub reads from the 302 is the file's, not the redirect's."""
    _hf, _client = api()
    from huggingface_hub import get_hf_file_metadata

    url = resolve_url(hub, "org/gated", "weights.safetensors")
    for method in ("HEAD", "GET"):
        answer = httpx2.request(
            method, url, headers={"Authorization": f"Bearer {GOOD}"}, timeout=10
        )
        assert answer.status_code == 302
        location = urlsplit(answer.headers["Location"])
        assert f"{location.scheme}://{location.netloc}" == hub.storage_url != hub.url
        assert "Signature=" in location.query and "Expires=" in location.query
        assert answer.headers["X-Linked-Etag"] == f'"{hashlib.sha256(GATED_WEIGHTS).hexdigest()}"'
        assert answer.headers["X-Linked-Size"] == str(len(GATED_WEIGHTS))
        assert answer.headers["X-Repo-Commit"] == hub.repos["org/gated"].sha
        assert answer.headers["ETag"].startswith('W/"')  # the redirect's own, not the file's
    metadata = get_hf_file_metadata(url, token=GOOD)
    assert metadata.etag == hashlib.sha256(GATED_WEIGHTS).hexdigest()
    assert metadata.size == len(GATED_WEIGHTS)
    assert metadata.commit_hash == hub.repos["org/gated"].sha
    assert metadata.location.startswith(hub.storage_url)
    # Access is checked before the redirect: no signed URL for a token without access.
    denied = httpx2.head(url, headers={"Authorization": f"Bearer {UNAPPROVED}"}, timeout=10)
    assert denied.status_code == 403 and "Location" not in denied.headers
    # Small files come from the hub itself.
    small = httpx2.get(resolve_url(hub, "org/public", "config.json"), timeout=10)
    assert small.status_code == 200 and small.content == b'{"a": 1}'


def test_storage_origin_is_strict(hub):
    url = resolve_url(hub, "org/gated", "weights.safetensors")
    location = httpx2.head(url, headers={"Authorization": f"Bearer {GOOD}"}).headers["Location"]
    whole = httpx2.get(location, timeout=10)
    assert whole.status_code == 200 and whole.content == GATED_WEIGHTS
    part = httpx2.get(location, headers={"Range": "bytes=1000-1999"}, timeout=10)
    assert part.status_code == 206 and part.content == GATED_WEIGHTS[1000:2000]
    assert part.headers["Content-Range"] == f"bytes 1000-1999/{len(GATED_WEIGHTS)}"
    tail = httpx2.get(location, headers={"Range": "bytes=-10"}, timeout=10)
    assert tail.status_code == 206 and tail.content == GATED_WEIGHTS[-10:]
    # A token beside the signature is refused, as a presigned-URL store refuses it.
    with_token = httpx2.get(location, headers={"Authorization": f"Bearer {GOOD}"}, timeout=10)
    assert with_token.status_code == 400
    tampered = location.replace("Expires=", "Expires=9")
    assert httpx2.get(tampered, timeout=10).status_code == 403
    assert httpx2.get(location.split("?")[0], timeout=10).status_code == 403
    # The log hides the token's value but says that one came.
    refused = [r for r in hub.at_storage() if r.status == 400]
    assert refused and refused[0].authenticated and refused[0].token_seen
    assert refused[0].headers["Authorization"] == "<hidden>"
    assert all(GOOD not in str(r) for r in hub.requests)


def test_snapshot_download_follows_the_redirect_without_the_token(hub, tmp_path):
    hf, _client = api()
    target = tmp_path / "gated"
    hf.snapshot_download("org/gated", local_dir=target, token=GOOD)
    assert (target / "weights.safetensors").read_bytes() == GATED_WEIGHTS
    assert (target / "config.json").read_bytes() == b"{}"
    [head] = [r for r in hub.requests if r.method == "HEAD" and r.file == "weights.safetensors"]
    assert head.status == 302 and head.authenticated and head.origin == "hub"
    [body] = hub.fetched("weights.safetensors")
    assert body.origin == "storage" and body.status == 200
    stored = hub.at_storage()
    assert stored and not any(r.authenticated or r.token_seen for r in stored)
    # The small file came from the hub, with the token.
    [small] = hub.fetched("config.json")
    assert small.origin == "hub" and small.authenticated


@pytest.mark.parametrize("hold", [0, 4], ids=["cut", "stalled"])
def test_huggingface_hub_resumes_at_the_storage_origin(hub, tmp_path, monkeypatch, hold):
    """A connection to the storage origin cut (or silent past HF_HUB_DOWNLOAD_TIMEOUT) is
    resumed there with a Range request, without the token, and the file verifies.

    huggingface_hub 2.4.0 (file_download.http_get) counts only whole chunks of
    DOWNLOAD_CHUNK_SIZE (10 MiB) as received, so it resumes from the last chunk boundary: a
    cut inside the first 10 MiB starts the file again without a Range."""
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
    hf, _client = api()
    from huggingface_hub import constants

    cut_at = 15 << 20
    hub.stalls.append(Stall(path="weights.safetensors", after_bytes=cut_at, seconds=hold))
    target = tmp_path / "gated"
    hf.snapshot_download("org/gated", local_dir=target, token=GOOD)
    assert (target / "weights.safetensors").read_bytes() == GATED_WEIGHTS
    first, resumed = hub.fetched("weights.safetensors")
    assert first.origin == resumed.origin == "storage"
    boundary = cut_at // constants.DOWNLOAD_CHUNK_SIZE * constants.DOWNLOAD_CHUNK_SIZE
    assert boundary > 0
    assert first.range is None and resumed.range == f"bytes={boundary}-"
    assert resumed.status == 206
    assert not any(r.authenticated or r.token_seen for r in hub.at_storage())


def test_redirect_off_serves_everything_from_the_hub(tmp_path, monkeypatch):
    with LocalHub(redirect_lfs=False) as hub:
        hub.add_repo("org/public", {"config.json": b'{"a": 1}', "model.safetensors": b"x" * 5000})
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        hf, _client = api()
        target = tmp_path / "public"
        hf.snapshot_download("org/public", local_dir=target)
        assert (target / "model.safetensors").read_bytes() == b"x" * 5000
        fetched = hub.fetched()
        assert len(fetched) == 2 and {r.origin for r in fetched} == {"hub"}
        assert hub.at_storage() == []
        assert all(not r.authenticated for r in hub.requests)


# Fault modes for the kit's hardening tests: a malicious listing, a hub that never answers, a
# busy hub.

EVIL = {"../../escape.txt": b"outside", "/tmp/absolute.txt": b"abs", "config.json": b"{}"}


def test_malicious_names_are_listed_and_served_verbatim(hub):
    hub.add_repo("org/evil", EVIL)
    sha = hub.repos["org/evil"].sha
    tree = httpx2.get(f"{hub.url}/api/models/org/evil/tree/{sha}?recursive=true", timeout=10)
    assert sorted(entry["path"] for entry in tree.json()) == sorted(EVIL)
    info = httpx2.get(f"{hub.url}/api/models/org/evil/revision/{sha}?blobs=true", timeout=10)
    assert sorted(s["rfilename"] for s in info.json()["siblings"]) == sorted(EVIL)
    # The raw path is sent as is (no client-side dot-segment removal) and served.
    import http.client

    host, port = urlsplit(hub.url).netloc.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", f"/org/evil/resolve/{sha}/../../escape.txt")
    answer = connection.getresponse()
    assert answer.status == 200 and answer.read() == b"outside"
    connection.close()


def test_a_hanging_hub_accepts_and_never_answers(hub):
    import time

    hub.hangs.append("/api/")
    started = time.monotonic()
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.get(f"{hub.url}/api/models/org/public", timeout=httpx2.Timeout(10, read=1))
    assert 1 <= time.monotonic() - started < 5
    # Logged on arrival (the connection was accepted and the request read), never answered.
    assert [r.status for r in hub.requests if r.path == "/api/models/org/public"] == [0]
    # Other paths are served.
    assert httpx2.get(resolve_url(hub, "org/public", "config.json"), timeout=10).status_code == 200


def test_a_busy_hub_answers_429_and_503_then_serves(hub):
    from tests.support.hub_server import Busy

    hub.busy += [
        Busy("/api/models/org/public", 429, times=1, retry_after="1"),
        Busy("/api/models/org/public", 503, times=2),
    ]
    url = f"{hub.url}/api/models/org/public"
    answers = [httpx2.get(url, timeout=10) for _ in range(4)]
    assert [a.status_code for a in answers] == [429, 503, 503, 200]
    assert answers[0].headers["Retry-After"] == "1"
    assert "Retry-After" not in answers[1].headers
    assert answers[3].json()["id"] == "org/public"
