"""The Lambda handler (`ortserve.functions.aws.handler.handler`) of the buffered container image.

Lambda imports this module once per execution environment, in its init phase, in the
process that serves the invokes (no fork, unlike Cloud Functions): the cold start runs
here, loading the model now when it fits the init budget and on the first invoke
otherwise (see functions/aws/runtime.py). Each invoke is one API Gateway or Function URL
event, answered with the whole response; streaming is the other image's job
(Dockerfile.stream). No web framework and, unless S3 or a secret is configured, no boto3
is imported on this path.
"""

from __future__ import annotations

from typing import Any

from ortserve.functions.aws.runtime import LambdaApp
from ortserve.functions.aws.settings import LambdaSettings

app = LambdaApp(LambdaSettings())
app.cold_start()


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Answer one API Gateway (REST or HTTP API) or Function URL event."""
    return app.handle(event, context)
