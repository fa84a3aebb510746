"""The documentation builds and its links hold (#28 item 8): the MkDocs site under docs/
builds with `--strict` (every page in the nav, every link and anchor between pages found;
mkdocs.yml turns those checks into warnings, which --strict makes errors), and every
relative link of README.md names a file of the repository, as GitHub resolves it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.models import ROOT

README = ROOT / "README.md"
# Markdown links and images, `[text](target)` / `![alt](target "title")`, and HTML src/href.
_MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_LINK = re.compile(r"""(?:src|href)=["']([^"']+)["']""")
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def _relative_links(markdown: str) -> list[str]:
    """The links of `markdown` outside code blocks that point into the repository: not a
    URL with a scheme, not a bare `#anchor`."""
    text = _FENCE.sub("", markdown)
    targets = _MARKDOWN_LINK.findall(text) + _HTML_LINK.findall(text)
    return [t for t in targets if not urlsplit(t).scheme and not t.startswith("#")]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        # Material's notice about MkDocs 2.0 is not a finding of the build.
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_relative_link_of_the_readme_names_a_file() -> None:
    links = _relative_links(README.read_text(encoding="utf-8"))
    assert any(link.startswith("docs/") for link in links), links
    missing = [
        link for link in links if not (README.parent / unquote(urlsplit(link).path)).exists()
    ]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_the_link_finder_sees_every_kind_of_link() -> None:
    text = (
        '[a](docs/a.md) ![b](docs/img/b.png "title") <img src="c.png" width="3"> '
        "[d](https://example.org/d) [e](#e) [f](docs/f.md#part)\n```sh\n[g](g.md)\n```\n"
    )
    assert _relative_links(text) == ["docs/a.md", "docs/img/b.png", "docs/f.md#part", "c.png"]


ACTIVATE = "source .venv/bin/activate"
# A shell line that runs the bare `ortserve` command (first word), not `.venv/bin/ortserve`.
_BARE = re.compile(r"^(?:[^#\n]*\|\s*)?ortserve\s", re.MULTILINE)


def test_the_pages_put_ortserve_on_the_path_before_they_use_it() -> None:
    """#53 item 4: `which ortserve` found nothing after `make demo`, and no page said how.
    README.md and getting-started show `source .venv/bin/activate` in a shell block before
    their first bare `ortserve` command, and that line, run as written where `make demo`
    and `make test` leave the venv, puts this checkout's `ortserve` on the PATH."""
    for page in (README, ROOT / "docs" / "getting-started.md"):
        blocks = re.findall(r"^```sh\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)
        first = next(i for i, block in enumerate(blocks) if _BARE.search(block))
        told = [
            i
            for i, block in enumerate(blocks)
            if any(line.split("#")[0].strip() == ACTIVATE for line in block.splitlines())
        ]
        assert told and told[0] <= first, (page.name, blocks[first])
    proc = subprocess.run(
        ["bash", "-c", f"{ACTIVATE} && command -v ortserve && ortserve --version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    found, version = proc.stdout.splitlines()
    assert Path(found) == ROOT / ".venv" / "bin" / "ortserve" and version.startswith("ortserve ")
