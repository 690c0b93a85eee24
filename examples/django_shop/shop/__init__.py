"""The shop's project package: its settings, its URLs and its WSGI application."""
