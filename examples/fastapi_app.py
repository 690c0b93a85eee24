"""A FastAPI app that enqueues a job in the same transaction as its own write, and the
``async def`` task that runs it (docs/guides/async.md).

Serve it from the repository root, with miniqueue installed (``pip install -e .``)::

    pip install fastapi uvicorn
    export DATABASE_URL=postgresql://localhost/mydb
    miniqueue migrate                                                 # the queue's tables
    uvicorn examples.fastapi_app:api                                  # the web app, on 127.0.0.1:8000
    miniqueue-supervise --app examples.fastapi_app:tasks              # its workers (in another shell)
    curl -X POST localhost:8000/signups -H 'content-type: application/json' -d '{"email": "ada@example.com"}'

The same email again answers 409 Conflict, and stores and enqueues nothing.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

import miniqueue

tasks = miniqueue.App()


@tasks.task("send_welcome", queue="emails")
async def send_welcome(job: miniqueue.Job) -> None:
    # (Send the email here, with an async client: `await mailer.send(...)`.)
    async with job.atransaction() as conn:  # this write and the job's completion commit together
        await conn.execute("UPDATE users SET welcomed_at = now() WHERE id = %s", [job.payload["user_id"]])


USERS = """
CREATE TABLE IF NOT EXISTS users (
    id BIGSERIAL PRIMARY KEY, email TEXT NOT NULL UNIQUE, referrals INT NOT NULL DEFAULT 0,
    welcomed_at TIMESTAMPTZ)
"""


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    # One pool for the app's queries and the queue's: miniqueue.AsyncClient(pool) borrows from it.
    async with AsyncConnectionPool(os.environ["DATABASE_URL"], kwargs={"autocommit": True}, open=False) as pool:
        async with pool.connection() as conn:
            await conn.execute(USERS)
        api.state.pool, api.state.queue = pool, miniqueue.AsyncClient(pool)
        yield


api = FastAPI(lifespan=lifespan)


class SignUp(BaseModel):
    email: str
    referrer: str | None = None


@api.post("/signups", status_code=201)
async def sign_up(signup: SignUp, request: Request) -> dict[str, int]:
    pool: AsyncConnectionPool = request.app.state.pool
    queue: miniqueue.AsyncClient = request.app.state.queue
    async with pool.connection() as conn, conn.transaction():  # commits at the end, or rolls back
        cur = await conn.execute(
            "INSERT INTO users (email) VALUES (%s) ON CONFLICT (email) DO NOTHING RETURNING id", [signup.email]
        )
        inserted = await cur.fetchone()
        if inserted is None:  # signed up already: no second user, no second welcome
            raise HTTPException(409, f"{signup.email!r} has already signed up")
        user_id: int = inserted[0]
        job = await tasks.aenqueue(queue, "send_welcome", {"user_id": user_id}, conn=conn)
        if signup.referrer is not None:
            cur = await conn.execute("UPDATE users SET referrals = referrals + 1 WHERE email = %s", [signup.referrer])
            if cur.rowcount == 0:  # the user and the job are rolled back together
                raise HTTPException(422, f"no user {signup.referrer!r} to credit the referral to")
    return {"user": user_id, "job": job.id}
