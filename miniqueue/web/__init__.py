"""The miniqueue dashboard: an ASGI app to mount in your own app, or to run with ``miniqueue web``.

Needs the ``web`` extra (``pip install '.[web]'`` from a checkout).
"""

from .redaction import redact_keys
from .server import create_app, serve

__all__ = ["create_app", "redact_keys", "serve"]
