"""The server's per-token Python path alone, in one process: issue 15, session 9's check.

    python benchmarks/cpu9/asgi_chain.py [--tree DIR] [--streams 64] [--tokens 128] [--rounds 3]
        [--endpoint chat|completions]

No sockets, no engine process, no HTTP client: the real app (create_app, the OpenAI route,
stream_text, detokenization, the SSE response) is called as an ASGI app with `streams`
concurrent streaming requests, and an EngineClient whose engine channel is stubbed out is fed
one STEP event at a time through its own `_on_step` (ipc-packed TokenOutputs, one real SmolLM2
token id per stream per step, from the held-out code prompts). After each step the loop waits
until every stream has taken its output, so every token is one SSE chunk (no coalescing). The
ASGI `send` only counts bytes. Reported: process CPU microseconds per chunk over the decode
phase. --tree runs the sglaunch package found in DIR (e.g. a `git archive HEAD sglaunch`
extraction) instead of this checkout's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = ROOT / "benchmarks" / "gpu6" / "smolcfg"
PROMPTS = ROOT / "benchmarks" / "gpu6" / "heldout_code.jsonl"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree))
    import uvloop

    results = [uvloop.run(one_round(args)) for _ in range(args.rounds)]
    print(json.dumps({"tree": str(args.tree), "streams": args.streams, "tokens": args.tokens,
                      "endpoint": args.endpoint, "us_per_chunk": results}))
    return 0


async def one_round(args) -> float:
    from tokenizers import Tokenizer

    from sglaunch.engine import ipc
    from sglaunch.engine.engine_client import EngineClient
    from sglaunch.engine.interface import TokenOutput
    from sglaunch.server.app import create_app
    from sglaunch.server.generation import ServerContext
    from sglaunch.server.metrics import ServerMetrics
    from sglaunch.server.state import ServerState
    from sglaunch.server.tokenizer import load_tokenizer

    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    corpus = [t for row in rows for m in row["messages"]
              for t in tok.encode(m["content"], add_special_tokens=False).ids]

    class _Closed:
        closed = True

    class _Checker:
        def check(self, *_):
            pass

    engine = EngineClient.__new__(EngineClient)
    engine._streams, engine._static, engine._live = {}, {}, {}
    engine._checker, engine._stopping, engine._failure = _Checker(), False, None
    engine._exited, engine._commands = asyncio.Event(), _Closed()
    engine.config = None
    tokenizer = load_tokenizer(TOKENIZER_DIR)
    state = ServerState("bench", str(TOKENIZER_DIR))
    state.ctx = ServerContext(engine, tokenizer, 4096, ServerMetrics(), tokenizer.vocab_size)
    app = create_app(state)

    chunks = [0]
    never = asyncio.get_running_loop().create_future()

    async def request(index: int) -> None:
        row = rows[index % len(rows)]
        if args.endpoint == "chat":
            path, body = "/v1/chat/completions", {"messages": row["messages"]}
        else:
            path, body = "/v1/completions", {"prompt": row["messages"][-1]["content"]}
        body.update(model="bench", stream=True, max_tokens=args.tokens, temperature=0, ignore_eos=True)
        raw = json.dumps(body).encode()
        sent = [False]

        async def receive():
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await never
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                chunks[0] += 1

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "", "server": ("127.0.0.1", 80),
                 "client": ("127.0.0.1", 1000 + index),
                 "headers": [(b"content-type", b"application/json"),
                             (b"content-length", str(len(raw)).encode())]}
        await app(scope, receive, send)

    tasks = [asyncio.create_task(request(i)) for i in range(args.streams)]
    while len(engine._streams) < args.streams:
        await asyncio.sleep(0.001)
    rids = list(engine._streams)
    cpu0 = None
    for step in range(args.tokens):
        if step == 1:  # NOTE: from the second token on: the first goes with the response start
            cpu0, chunks0 = time.process_time(), chunks[0]
        last = step == args.tokens - 1
        outputs = [TokenOutput(rid, (corpus[(i * 131 + step) % len(corpus)],), last,
                               "length" if last else None, 10, step + 1, 0) for i, rid in enumerate(rids)]
        engine._on_step(ipc.decode(ipc.encode((ipc.STEP, ipc.pack_outputs(outputs), [], None)))[1], [], None)
        while any(s.items for s in list(engine._streams.values())):
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    cpu = time.process_time() - cpu0
    return 1e6 * cpu / (chunks[0] - chunks0)


if __name__ == "__main__":
    sys.exit(main())
