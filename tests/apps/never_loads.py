"""An app module whose import never ends, as one waiting at import on a service that never
answers would."""

import threading

threading.Event().wait()
