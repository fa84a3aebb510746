"""The Cloud Functions page's deploy commands (docs/cloud-functions.md) follow the
concurrency rule the page states (#26 item 5): `--concurrency` is what an instance takes
(MAX_CONCURRENCY x MAX_BATCH + MAX_QUEUE, the settings' defaults unless the command sets
them) and gunicorn's `THREADS` stay above it, so a health check always finds a free
thread."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ortserve.core.settings import ServerSettings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cloud-functions.md"


def _deploy_commands() -> list[list[str]]:
    """The words of each command on the page that deploys the Cloud Functions bundle."""
    text = PAGE.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if "--source" in words and words[words.index("--source") + 1] == "dist/gcf":
                commands.append(words)
    return commands


def _option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_the_docs_deploy_the_gcf_bundle_both_ways() -> None:
    assert [words[:3] for words in _deploy_commands()] == [
        ["gcloud", "functions", "deploy"],
        ["gcloud", "run", "deploy"],
    ]


@pytest.mark.parametrize("words", _deploy_commands(), ids=lambda w: " ".join(w[:2]))
def test_concurrency_is_what_an_instance_takes_and_threads_stay_above_it(
    words: list[str],
) -> None:
    env = dict(pair.split("=", 1) for pair in _option(words, "--set-env-vars").split(","))
    fields = ServerSettings.model_fields

    def setting(name: str) -> int:
        return int(env.get(f"ORTSERVE_{name.upper()}", fields[name].default))

    takes = setting("max_concurrency") * setting("max_batch") + setting("max_queue")
    concurrency = int(_option(words, "--concurrency"))
    assert concurrency == takes
    assert int(env["THREADS"]) >= concurrency + 2  # a thread or two for health checks
