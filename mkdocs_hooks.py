"""An MkDocs hook (see mkdocs.yml): the docstrings' Sphinx roles, read as code on the site.

The package's docstrings name other objects the Sphinx way (``:class:`~miniqueue.Client```,
``:meth:`run```), which mkdocstrings renders as the role's text followed by the name. This
turns each into the name alone, as code (``~`` keeps the last component, as in Sphinx).
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):<code>(~?)([^<]+)</code>")


def _name(match: re.Match[str]) -> str:
    tilde, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    return _ROLE.sub(_name, html)
