#!/usr/bin/env python3
"""An MCP client for cortex's end-to-end tests, built on the official Python SDK (PyPI
`mcp`), which nobody here wrote. It holds one connection and takes commands, one JSON
object per line on stdin, answering each with one JSON line on stdout, so a test can
restart the hub between two of them.

    client.py --http URL [--token T] [--origin O] [--session NAME] [--mode legacy|auto] [--tasks]
    client.py --stdio CMD [ARG...] [--mode ...] [--tasks]

Commands: {"op": "info"}, {"op": "tools"}, {"op": "call", "name", "args"}, {"op":
"task", "name", "args"} (a call the server may answer with a task), {"op": "get", "id"},
{"op": "until", "id", "timeout"} (polls tasks/get until the task ends), {"op": "cancel",
"id"}, {"op": "raw", "method", "params"}, {"op": "listen", "ids", "tasks"} (opens
`subscriptions/listen` naming tasks, answering with its acknowledgment or error), {"op":
"pushed", "id", "timeout"} (the next `notifications/tasks` of that task), {"op":
"listen_end", "timeout"} (the listen's final result).
"""

import argparse
import json
import os
import sys
import time
from contextlib import AsyncExitStack
from typing import Any, ClassVar, Literal

import anyio
from pydantic import ConfigDict, TypeAdapter

from mcp import ClientSession, StdioServerParameters
from mcp.client.client import Client
from mcp.client.extension import ClientExtension, NotificationBinding, ResultClaim
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import Implementation, NotificationParams, Request, RequestParams, Result

TASKS = "io.modelcontextprotocol/tasks"


class TaskHandle(Result):
    """A tool call answered with a task (resultType "task")."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = "task"


async def never(handle: TaskHandle, ctx: Any):
    raise RuntimeError("the test polls the task itself")


class Tasks(ClientExtension):
    """The tasks extension as a client declares it: it takes a task for a tool call."""

    identifier = TASKS

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=never)]

    def notifications(self):
        return [NotificationBinding(method="notifications/tasks", params_type=TaskNote, handler=on_task)]


class TaskNote(NotificationParams):
    """`notifications/tasks`: a task as `tasks/get` shows it."""

    model_config = ConfigDict(extra="allow")


class AnyParams(RequestParams):
    model_config = ConfigDict(extra="allow")


def raw_request(method: str, name_param: str | None):
    class Raw(Request[AnyParams, str]):
        pass

    Raw.name_param = name_param
    return Raw


ANY = TypeAdapter(dict[str, Any])


class ChannelParams(NotificationParams):
    """Claude Code's channel message: `notifications/claude/channel` {content, meta}."""

    model_config = ConfigDict(extra="allow")
    content: str
    meta: dict[str, str] | None = None


CHANNEL: list[dict] = []
ASKED: list[str] = []
PUSHED: list[dict] = []
ACKS: list[dict] = []
LISTENS: dict[str, dict] = {}


async def on_task(p: TaskNote) -> None:
    PUSHED.append({**p.model_dump(by_alias=True, mode="json"), "at": time.time()})


async def on_message(m: Any) -> None:
    method = getattr(getattr(m, "root", m), "method", None)
    if method == "notifications/subscriptions/acknowledged":
        ACKS.append(getattr(m, "root", m).params.model_dump(by_alias=True, mode="json", exclude_none=True))


def elicitation(answer: str):
    """A person who, asked through the client, answers `answer` (accept or decline)."""
    import mcp_types

    async def callback(context, params):
        ASKED.append(params.message)
        if answer == "accept":
            return mcp_types.ElicitResult(action="accept", content={"approve": True})
        return mcp_types.ElicitResult(action="decline")

    return callback


async def on_channel(p: ChannelParams) -> None:
    CHANNEL.append({"content": p.content, "meta": p.meta, "at": time.time()})


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--http")
    ap.add_argument("--token")
    ap.add_argument("--origin")
    ap.add_argument("--session")
    ap.add_argument("--mode", default="legacy")
    ap.add_argument("--tasks", action="store_true")
    ap.add_argument("--client-name", default="mcp")
    ap.add_argument("--elicit", choices=["accept", "decline"])
    ap.add_argument("--stdio", nargs=argparse.REMAINDER)
    a = ap.parse_args()

    async with AsyncExitStack() as stack:
        if a.http:
            headers = {}
            if a.token:
                headers["Authorization"] = f"Bearer {a.token}"
            if a.origin:
                headers["Origin"] = a.origin
            if a.session:
                headers["Cortex-Session"] = a.session
            http = create_mcp_http_client(headers=headers)
            transport = streamable_http_client(a.http, http_client=http)
        else:
            transport = stdio_client(
                StdioServerParameters(command=a.stdio[0], args=a.stdio[1:], env=dict(os.environ))
            )
        extensions = [Tasks()] if a.tasks else []
        if a.mode == "legacy":
            read, write = await stack.enter_async_context(transport)
            session = await stack.enter_async_context(
                ClientSession(
                    read,
                    write,
                    client_info=Implementation(name=a.client_name, version="1.0.0"),
                    elicitation_callback=elicitation(a.elicit) if a.elicit else None,
                    notification_bindings=[
                        NotificationBinding(
                            method="notifications/claude/channel",
                            params_type=ChannelParams,
                            handler=on_channel,
                        )
                    ],
                    extensions={TASKS: {}} if a.tasks else None,
                    result_claims={TASKS: [Tasks().claims()[0]]} if a.tasks else None,
                )
            )
            init = await session.initialize()
            version = init.protocol_version
        else:
            client = await stack.enter_async_context(
                Client(transport, mode=a.mode, extensions=extensions, message_handler=on_message)
            )
            session = client._session
            version = session.protocol_version
        out({"ready": True, "protocol": str(version)})
        group = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(group.cancel_scope.cancel)
        global GROUP
        GROUP = group
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            cmd = json.loads(line)
            try:
                out(await run(session, cmd))
            except Exception as e:  # the test reads the error
                out({"error": f"{type(e).__name__}: {e}"})


async def run(session: ClientSession, cmd: dict) -> dict:
    op = cmd["op"]
    if op == "tools":
        tools = await session.list_tools()
        return {"tools": [t.name for t in tools.tools],
                "schemas": {t.name: t.input_schema for t in tools.tools}}
    if op in ("call", "task"):
        progress = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(message)

        r = await session.call_tool(
            cmd["name"],
            cmd.get("args") or {},
            progress_callback=on_progress,
            allow_claimed=(op == "task"),
        )
        if isinstance(r, TaskHandle):
            return {"task": r.model_dump(by_alias=True, mode="json")}
        return {
            "ok": not r.is_error,
            "text": "".join(getattr(c, "text", "") for c in r.content),
            "structured": r.structured_content,
            "progress": len(progress),
        }
    if op == "get":
        return await raw(session, "tasks/get", {"taskId": cmd["id"]}, "taskId")
    if op == "cancel":
        return await raw(session, "tasks/cancel", {"taskId": cmd["id"]}, "taskId")
    if op == "until":
        deadline = time.monotonic() + float(cmd.get("timeout", 60))
        while True:
            t = await raw(session, "tasks/get", {"taskId": cmd["id"]}, "taskId")
            if t.get("status") in ("completed", "failed", "cancelled"):
                return t
            if time.monotonic() > deadline:
                return {"error": "timed out", "last": t}
            await anyio.sleep(min(t.get("pollIntervalMs", 200), 200) / 1000)
    if op == "channel":
        deadline = time.monotonic() + float(cmd.get("timeout", 30))
        while not CHANNEL:
            if time.monotonic() > deadline:
                return {"error": "no channel message"}
            await anyio.sleep(0.01)
        return CHANNEL.pop(0)
    if op == "listen":
        lid = f"listen-{len(LISTENS) + 1}"
        params: dict[str, Any] = {"notifications": {"taskIds": cmd["ids"]}}
        acks = len(ACKS)

        async def listen() -> None:
            try:
                LISTENS[lid] = {"result": await raw(session, "subscriptions/listen", params, None)}
            except Exception as e:
                LISTENS[lid] = {"error": f"{type(e).__name__}: {e}"}

        GROUP.start_soon(listen)
        deadline = time.monotonic() + float(cmd.get("timeout", 30))
        while len(ACKS) == acks and lid not in LISTENS:
            if time.monotonic() > deadline:
                return {"error": "no acknowledgment"}
            await anyio.sleep(0.01)
        if lid in LISTENS:
            return LISTENS[lid]
        return {"ack": ACKS[-1]}
    if op == "pushed":
        deadline = time.monotonic() + float(cmd.get("timeout", 30))
        while True:
            for i, n in enumerate(PUSHED):
                if n.get("taskId") == cmd["id"]:
                    return PUSHED.pop(i)
            if time.monotonic() > deadline:
                return {"error": "nothing pushed"}
            await anyio.sleep(0.005)
    if op == "listen_end":
        deadline = time.monotonic() + float(cmd.get("timeout", 30))
        while not LISTENS:
            if time.monotonic() > deadline:
                return {"error": "the listen did not end"}
            await anyio.sleep(0.01)
        return LISTENS.pop(next(iter(LISTENS)))
    if op == "asked":
        return {"asked": ASKED}
    if op == "now":
        return {"at": time.time()}
    if op == "raw":
        return await raw(session, cmd["method"], cmd.get("params") or {}, cmd.get("name_param"))
    return {"error": f"unknown op {op}"}


async def raw(session: ClientSession, method: str, params: dict, name_param: str | None) -> dict:
    req = raw_request(method, name_param)(method=method, params=AnyParams(**params))
    return await session.send_request(req, ANY)


GROUP: Any = None


def out(v: dict) -> None:
    sys.stdout.write(json.dumps(v) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    anyio.run(main)
