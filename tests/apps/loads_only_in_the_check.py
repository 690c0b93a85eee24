"""An app that loads in the supervisor's check but fails to import in every worker and the
reaper, as a module whose import depends on the process would."""

from miniqueue import App
from miniqueue.core.process import label

if label() != "app-check":
    raise RuntimeError(f"this app fails in {label()} on purpose")

app = App()
