"""The producer and inspector: :class:`Client`, :class:`AsyncClient`, results.

Rule: Imports ``core``, ``tasks``, ``store`` and ``observability``.
"""
