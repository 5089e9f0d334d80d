"""MkDocs hooks for the documentation site (mkdocs.yml ``hooks:``).

* A page's link out of docs/ (``../bench/results/x.png``) points at the repository's file: docs/*.md are read
  on GitHub and on the site alike, and a relative link that leaves docs/ works on GitHub only.
* The docstrings' Sphinx roles (``:class:`~pulsar_nack.index.TimeBucketIndex```) show as code with the name
  Sphinx would show (the last part after ``~``), not as ``:class:`` followed by the path.
"""

from __future__ import annotations

import re
from typing import Any

REPOSITORY = "https://github.com/pulsar-nack/pulsar-nack/blob/main/"
_OUT_OF_DOCS = re.compile(r"\]\(\.\./([^)\s]+)\)")
_ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def on_page_markdown(markdown: str, **_: Any) -> str:
    return _OUT_OF_DOCS.sub(lambda m: f"]({REPOSITORY}{m.group(1)}?raw=true)", markdown)


def _role(match: re.Match[str]) -> str:
    tilde, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"


def on_page_content(html: str, **_: Any) -> str:
    return _ROLE.sub(_role, html)
