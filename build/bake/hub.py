"""Download a model from the Hugging Face Hub (or HF_ENDPOINT) with huggingface_hub.

huggingface_hub itself honours HF_TOKEN, HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE=1,
reuses its local cache, and shows a progress bar.
"""

from __future__ import annotations

from pathlib import Path

from ortserve.bake.errors import BakeError
from ortserve.bake.onnx_source import GRAPH_DIR, Variant, choose_variant, data_patterns, graphs_in
from ortserve.bake.source_files import HF_PATTERNS, ONNX_PATTERNS, ONNX_SMALL_FILES
from ortserve.core.errors import first_line


def _patterns(
    repo_id: str, revision: str, onnx_file: str | None, runtime_ep: str
) -> tuple[list[str], Variant | None]:
    """Only what a bake needs: a checkpoint's files, or an ONNX export's, not both; of an
    export with several graphs (onnx-community's onnx/ variants), the chosen graph only."""
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        # Cannot list files offline: the cache decides, the variant is chosen locally.
        return [*ONNX_PATTERNS, f"{GRAPH_DIR}/*"], None
    files = HfApi().list_repo_files(repo_id, revision=revision)
    graphs = graphs_in(files)
    top_graphs = [g for g in graphs if "/" not in g]
    weights = any(f.endswith(".safetensors") and "/" not in f for f in files)
    if top_graphs and "genai_config.json" in files:
        return [p for p in ONNX_PATTERNS if "safetensors" not in p], None  # an og export
    if top_graphs or (graphs and (onnx_file or not weights)):
        variant = choose_variant(graphs, runtime_ep, onnx_file)
        return [*ONNX_SMALL_FILES, variant.path, *data_patterns(variant.path)], variant
    return HF_PATTERNS, None


# How long the hub gets to accept a connection before a bake says it is unreachable.
_CONNECT_TIMEOUT_S = 5.0


def _unreachable(endpoint: str) -> str | None:
    """Why `endpoint` cannot be reached, or None. huggingface_hub retries an unreachable
    hub for ~23 s (five backoffs, not configurable in 2.4) before it fails: one TCP
    connect answers the question in at most a few seconds."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def download(
    repo_id: str, revision: str | None, onnx_file: str | None = None, runtime_ep: str = "cpu"
) -> tuple[Path, str, Variant | None]:
    """Download the files a bake needs of `repo_id` at `revision`.

    `onnx_file` and `runtime_ep` choose the graph of an ONNX export (see
    `bake.onnx_source.choose_variant`); only that graph and its data are downloaded.

    Returns:
        The local snapshot folder, the resolved commit sha, and the chosen graph (None
        for a checkpoint, or when the choice is left to the local files).

    Raises:
        BakeError: Unknown repo or revision, gated repo, offline without a cache, network.
    """
    import httpx2  # huggingface_hub 2.x transports with httpx2, not httpx
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rev = revision or "main"
    if not constants.HF_HUB_OFFLINE:
        reason = _unreachable(constants.ENDPOINT)
        if reason is not None:
            # Offline with a cached snapshot still works: let the hub client use its cache.
            try:
                folder = Path(snapshot_download(repo_id, revision=rev, local_files_only=True))
                return folder, folder.name, None
            except (LocalEntryNotFoundError, OSError):
                raise BakeError(
                    f"cannot download {repo_id}@{rev}: the hub is unreachable at "
                    f"{constants.ENDPOINT} ({reason}); no network? (HF_ENDPOINT sets the hub)"
                ) from None
    try:
        patterns, variant = _patterns(repo_id, rev, onnx_file, runtime_ep)
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
        raise BakeError(f"hub download of {repo_id}@{rev} failed: {first_line(exc)}") from None
    except OSError as exc:
        raise BakeError(f"hub download of {repo_id}@{rev} failed: {exc}") from None
    # The snapshot folder's name is the commit sha the revision resolved to.
    return folder, folder.name, variant
