"""Payloads encrypted at rest: AES-GCM in an app's middleware.

The enqueue hook seals each payload before it is stored, as ``{"kid": ..., "nonce": ...,
"ct": ...}``; the run hook opens it before the handler reads ``job.payload``, in the worker. The
key id stored with each payload lets keys rotate: put a new key first in ``PAYLOAD_KEYS`` (it
seals from then on), keep the old ones after it until no stored payload names them. The task
name is the cipher's associated data, so a sealed payload copied onto a job of another task
does not open.

``PAYLOAD_KEYS`` is ``id=KEY,id=KEY,...`` with each KEY 32 random bytes in base64 (make one with
``python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"``). What stays
in clear: the task, the queue, the keys a task computes from the payload (unique, sequence,
limits: computed before the hook seals it) and the handler's result.

Only a job enqueued through the app is sealed (``app.enqueue``, ``app.chain``, ``app.group``);
one enqueued by task name with a bare ``Client`` or ``miniqueue enqueue`` is stored as given,
and fails here for good rather than run on a payload nobody sealed. Run the workers with
``miniqueue-supervise --app examples.encrypted_payloads:app``.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import miniqueue


class Keyring:
    """AES-256-GCM keys by id: the first seals, every one opens what it sealed."""

    def __init__(self, keys: dict[str, bytes]) -> None:
        if not keys or any(len(key) != 32 for key in keys.values()):
            raise miniqueue.ConfigError("PAYLOAD_KEYS needs at least one key, each of 32 bytes (base64)")
        self.current = next(iter(keys))
        self.keys = {kid: AESGCM(key) for kid, key in keys.items()}

    @classmethod
    def parse(cls, text: str) -> Keyring:
        """Keys from ``id=KEY,id=KEY`` (KEY in base64), the sealing one first."""
        pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise miniqueue.ConfigError("PAYLOAD_KEYS is invalid: use id=BASE64KEY,id=BASE64KEY")
        return cls({kid.strip(): base64.b64decode(key) for kid, key in pairs})

    def seal(self, task: str, payload: Any) -> dict[str, str]:
        try:  # the queue checks the sealed payload: check the plain one as strictly here
            plain = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise miniqueue.InvalidInput(f"the payload of task {task!r} is not JSON: {exc}") from None
        nonce = os.urandom(12)  # random 96-bit nonces: rotate a key long before 2^32 payloads
        sealed = self.keys[self.current].encrypt(nonce, plain, task.encode())
        return {"kid": self.current, "nonce": _text(nonce), "ct": _text(sealed)}

    def open(self, task: str, sealed: Any) -> Any:
        """The payload ``seal`` sealed, or PermanentError: another try would read the same bytes."""
        if not isinstance(sealed, dict) or set(sealed) != {"kid", "nonce", "ct"}:
            raise miniqueue.PermanentError("the payload is not sealed: enqueue this task through the app")
        key = self.keys.get(sealed["kid"])
        if key is None:
            raise miniqueue.PermanentError(f"the payload was sealed with key {sealed['kid']!r}, not in PAYLOAD_KEYS")
        try:
            plain = key.decrypt(base64.b64decode(sealed["nonce"]), base64.b64decode(sealed["ct"]), task.encode())
        except InvalidTag:
            raise miniqueue.PermanentError(f"the payload does not open with key {sealed['kid']!r}") from None
        return json.loads(plain)


def _text(data: bytes) -> str:
    return base64.b64encode(data).decode()


class EncryptedPayloads(miniqueue.Middleware):
    """Seals payloads on enqueue and opens them around each run."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    def enqueue(self, spec: miniqueue.JobSpec) -> miniqueue.EnqueueHook:
        yield spec._replace(payload=self.keyring.seal(spec.task, spec.payload))

    def run(self, job: miniqueue.Job) -> miniqueue.RunHook:
        job.payload = self.keyring.open(job.task, job.payload)
        return (yield)


app = miniqueue.App()
# Registered first: nearest the database, it seals after any other middleware changed the
# payload, and opens it before any other reads it.
app.middleware(EncryptedPayloads(Keyring.parse(os.environ.get("PAYLOAD_KEYS", ""))))


@app.task("charge", queue="payments")
def charge(job: miniqueue.Job) -> dict[str, Any]:
    card, cents = job.payload["card"], job.payload["cents"]
    return {"charged": cents, "card": f"**** {card[-4:]}"}  # results are stored in clear
