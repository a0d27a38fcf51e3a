"""The weights stage's folders, made in one server_files run on the host: the weights folder
and its state folder, then each repository's folder, then each repository's state folder.

A gated repository's licence binds whoever downloaded it, so its folder is owned by root and
the service group (the server's users) with mode 0750; an open one's is root's, 0755. The paths
come from the hub's answer (hub_repo_info), whose repo_id server_files checks again as a plain
absolute path once joined: a repo_id with `..` parts is refused there."""

from __future__ import annotations

OPEN, GATED = "0755", "0750"


def weights_folders(
    repos: dict, needed: list, weights_dir: str, state_dir: str, service_group: str
) -> list[dict]:
    """server_files entries for the needed repositories of hub_repo_info's `repos`."""
    if not isinstance(repos, dict) or not isinstance(needed, (list, tuple)):
        raise ValueError("needs hub_repo_info's repos mapping and the list of needed repositories")
    entries = [_folder(weights_dir, OPEN), _folder(state_dir, OPEN)]
    found = []
    for name in needed:
        repo = repos.get(name)
        repo_id = repo.get("repo_id") if isinstance(repo, dict) else None
        if not isinstance(repo_id, str) or not repo_id:
            raise ValueError(f"the hub's answer has no repo_id for {name!r}")
        found.append((repo_id, repo.get("gated") is True))
    for repo_id, gated in found:
        folder = _folder(f"{weights_dir}/{repo_id}", GATED if gated else OPEN)
        entries.append({**folder, "owner": "root", "group": service_group if gated else "root"})
    entries += [_folder(f"{state_dir}/{repo_id.replace('/', '--')}", OPEN) for repo_id, _ in found]
    return entries


def _folder(path: str, mode: str) -> dict:
    return {"path": path, "state": "directory", "mode": mode}
