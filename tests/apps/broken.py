"""An app module that fails at import, as a typo in a deploy would."""

raise RuntimeError("this app is broken on purpose")
