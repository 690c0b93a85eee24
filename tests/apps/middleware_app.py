"""An app with middleware, for the supervised test: the enqueue hook stamps the producer's tenant
on the payload; the run hook takes it off again and marks the result with the process it ran in."""

from __future__ import annotations

import os
from typing import Any

from miniqueue import App, EnqueueHook, Job, JobSpec, Middleware, RunHook

app = App()


class Tenants(Middleware):
    def enqueue(self, spec: JobSpec) -> EnqueueHook:
        yield spec._replace(payload={**spec.payload, "tenant": "acme"})

    def run(self, job: Job) -> RunHook:
        tenant = job.payload.pop("tenant")
        result = yield
        return {"handler": result, "tenant": tenant, "hooked_in": os.getpid()}


app.middleware(Tenants())


@app.task("work")
def work(job: Job) -> dict[str, Any]:
    return {"pid": os.getpid(), "payload": job.payload}
