"""Loading an app by reference (``module:attribute``), as the supervisor, the dashboard and the
CLI do, with one-line errors that say where an app's own import failed."""

from __future__ import annotations

import importlib
import sys
import traceback

from ..core.errors import AppLoadError
from .app import App


def _where(exc: BaseException) -> str:
    """Where an import error was raised in the app's own code, as `` (at FILE:LINE)``: the
    innermost frame outside the import machinery, or nothing (a module that does not exist)."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<frozen ") and frame.filename not in (importlib.__file__, __file__)
    ]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def load_app(reference: str) -> App:
    """Import ``module:attribute`` and return the App it names, or raise AppLoadError, whose
    message is one line naming the reference and why it failed (where, for an error the app's
    own code raised)."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise AppLoadError(
            f"app reference {reference!r} is invalid: use 'module:attribute', e.g. 'myproject.tasks:app'"
        )
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`, let the current directory's modules be found
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a broken module can raise anything at import
        reason = " ".join(str(exc).split())  # one line, whatever the module raised
        raise AppLoadError(
            f"cannot import module {module_name!r} for app {reference!r}: {type(exc).__name__}: {reason}{_where(exc)}"
        ) from exc
    try:
        app = getattr(module, attribute)
    except AttributeError:
        raise AppLoadError(f"module {module_name!r} has no attribute {attribute!r} (app {reference!r})") from None
    if not isinstance(app, App):
        raise AppLoadError(f"{reference!r} is a {type(app).__name__}, not a miniqueue.App")
    return app
