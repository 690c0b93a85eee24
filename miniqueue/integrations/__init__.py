"""Enqueue inside another library's transaction: :mod:`.django` (Django's own connection) and
:mod:`.sqlalchemy` (a Session's or Connection's). Each is imported on its own, with its extra
installed (``miniqueue[django]``, ``miniqueue[sqlalchemy]``)."""
