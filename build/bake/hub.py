"""Download a model from the Hugging Face Hub (or HF_ENDPOINT) with huggingface_hub.

huggingface_hub itself honours HF_TOKEN, HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE=1,
reuses its local cache, and shows a progress bar.
"""

from __future__ import annotations

from pathlib import Path


def _patterns(repo_id: str, revision: str) -> list[str]:
    """Only what a bake needs: an ONNX export's files, or a checkpoint's, not both."""
    from huggingface_hub import HfApi, constants

    from bake.sources import HF_PATTERNS, ONNX_PATTERNS

    if constants.HF_HUB_OFFLINE:
        return ONNX_PATTERNS  # cannot list files offline; the cache decides
    files = HfApi().list_repo_files(repo_id, revision=revision)
    if any(f.endswith(".onnx") and "/" not in f for f in files):
        return [p for p in ONNX_PATTERNS if "safetensors" not in p]
    return HF_PATTERNS


def download(repo_id: str, revision: str | None) -> tuple[Path, str]:
    """Download the files a bake needs of `repo_id` at `revision`.

    Returns:
        The local snapshot folder and the resolved commit sha.

    Raises:
        BakeError: Unknown repo or revision, gated repo, offline without a cache, network.
    """
    import httpx2  # huggingface_hub 2.x transports with httpx2, not httpx
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from bake.errors import BakeError

    rev = revision or "main"
    try:
        patterns = _patterns(repo_id, rev)
        folder = Path(snapshot_download(repo_id, revision=rev, allow_patterns=patterns))
    except RevisionNotFoundError:
        raise BakeError(f"hub model {repo_id} has no revision {rev!r} (404)") from None
    except GatedRepoError:
        raise BakeError(
            f"hub model {repo_id} is gated: accept its terms and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise BakeError(
            f"hub model {repo_id} not found (404; private repos need HF_TOKEN)"
        ) from None
    except LocalEntryNotFoundError:
        raise BakeError(
            f"cannot download {repo_id}@{rev}: the hub is unreachable (no network, or "
            "HF_HUB_OFFLINE=1) and the model is not in the local cache"
        ) from None
    except httpx2.TransportError as exc:
        raise BakeError(
            f"cannot download {repo_id}@{rev}: the hub is unreachable ({exc}); no network?"
        ) from None
    except HfHubHTTPError as exc:
        raise BakeError(f"hub download of {repo_id}@{rev} failed: {exc}".splitlines()[0]) from None
    except OSError as exc:
        raise BakeError(f"hub download of {repo_id}@{rev} failed: {exc}") from None
    # The snapshot folder's name is the commit sha the revision resolved to.
    return folder, folder.name
