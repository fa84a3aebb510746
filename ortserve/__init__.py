"""ortserve: serve small language models with ONNX Runtime GenAI.

The one import name of the project. Its parts keep their folders (docs/architecture.md) and
are mapped in here: `ortserve.core` (engine, service, protocol, API: core/),
`ortserve.functions` (Lambda and Cloud Functions adapters: functions/), `ortserve.edge`
(the daemon: edge/) and `ortserve.bake` (build/bake/). The front, this folder, holds
what users call: the `ortserve` command (ortserve.cli), the model store
(ortserve.store) and the Python API, `from ortserve import TextGenerator`.

The Python API is imported on first use, so that importing a part (a Lambda handler,
the daemon) costs nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ortserve.core.errors import OrtServeError
    from ortserve.textgen import TextGenerator

__all__ = ["OrtServeError", "TextGenerator"]


def __getattr__(name: str) -> Any:
    if name == "TextGenerator":
        from ortserve.textgen import TextGenerator

        return TextGenerator
    if name == "OrtServeError":
        from ortserve.core.errors import OrtServeError

        return OrtServeError
    raise AttributeError(f"module 'ortserve' has no attribute {name!r}")
