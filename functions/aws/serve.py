"""Entry point of the streaming image (`python3 -m ortserve.functions.aws.serve`): the edge daemon.

The Lambda Web Adapter forwards each invoke to the daemon over HTTP and streams its
answer. Before the daemon starts, the same cold start as the buffered handler runs
(`functions.aws.coldstart`): API keys from Secrets Manager or SSM, and the model from S3
when configured. A failure there ends the process with the reason in the log (Lambda
then reports the init as failed); a model that fails to load keeps the daemon up with
`/readyz` answering 503, so the adapter never admits an invoke.
"""

from __future__ import annotations

import sys

from ortserve.core.logs import JsonLog
from ortserve.edge.settings import EdgeSettings
from ortserve.functions.aws.coldstart import cold_start
from ortserve.functions.aws.errors import SetupError
from ortserve.functions.aws.settings import LambdaSettings


class StreamSettings(LambdaSettings, EdgeSettings):
    """The streaming image's one settings object: where the model and keys come from
    (Lambda's), and the daemon's own (host, port, limits), read once at start."""

    # One request at a time, cold start first (as the buffered image): og in-process.
    engine_process: bool = False


def main() -> int:
    """Resolve keys and model, then run the edge daemon until Lambda stops the process."""
    try:
        ready = cold_start(StreamSettings(), JsonLog())
    except SetupError:  # logged by cold_start
        return 1
    from ortserve.edge.daemon import serve  # uvicorn: only once there is something to serve

    return serve(ready.settings)


if __name__ == "__main__":
    sys.exit(main())
