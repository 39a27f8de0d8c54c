"""Server-sent events as llama-server and `mlc_llm serve` stream them: one JSON payload per `data:` line."""

import json


def iter_sse(resp):
    """JSON payloads of a server-sent-events stream (`data: {...}` lines) until it ends or says [DONE]."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        yield json.loads(payload)
