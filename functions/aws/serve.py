"""Entry point of the streaming image (`python3 -m functions.aws.serve`): the edge daemon.

The Lambda Web Adapter forwards each invoke to the daemon over HTTP and streams its
answer. Before the daemon starts, the same cold-start sources as the buffered handler
are resolved: API keys from Secrets Manager or SSM, and the model from S3 when
configured. A failure there ends the process with the reason in the log (Lambda then
reports the init as failed); a model that fails to load keeps the daemon up with
`/readyz` answering 503, so the adapter never admits an invoke.
"""

from __future__ import annotations

import json
import sys

from functions.aws.errors import SetupError
from functions.aws.model_source import fetch_model
from functions.aws.secrets import resolve_api_keys
from functions.aws.settings import LambdaSettings


def main() -> int:
    """Resolve keys and model, then run the edge daemon until Lambda stops the process."""
    settings = LambdaSettings()
    try:
        keys = resolve_api_keys(settings)
        model_dir = settings.model_dir
        if settings.model_s3_uri:
            fetched = fetch_model(
                settings.model_s3_uri, settings.model_cache_dir, settings.model_sha256
            )
            model_dir = fetched.folder
    except SetupError as exc:
        line = {"level": "ERROR", "message": "cold start failed", "reason": exc.message}
        print(json.dumps(line, ensure_ascii=False), file=sys.stdout, flush=True)
        return 1
    from edge.daemon import serve
    from edge.settings import EdgeSettings

    # The daemon reads its other ORTSERVE_* settings (host, port, limits) itself.
    edge = EdgeSettings(model_dir=model_dir, api_keys=keys, threads=settings.threads,
                        max_batch=settings.max_batch)  # fmt: skip
    return serve(edge)


if __name__ == "__main__":
    sys.exit(main())
