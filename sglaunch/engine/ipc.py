"""The channel between the HTTP server process and the engine process. Torch-free.

Two ZeroMQ PUSH/PULL pipes over Unix sockets in a private folder, both bound by the server:
`commands` (server -> engine: add, abort, flush_cache, shutdown) and `events` (engine -> server:
ready or failed at start-up, then one message per engine step carrying every TokenOutput of that
step, the refusals, and the live statistics when they are due; and the answer to each
flush_cache, on the pipe it came from).

With `--tokenizer-worker-num N > 1` there are N + 1 pipe pairs (`Endpoints.pipes`): pair 0 is
the launcher's (the engine process's owner: ready/failed/stopped, shutdown, drop), pairs 1..N
belong to the HTTP worker processes, each bound by its worker. The engine reads every commands
pipe through one socket (an `add` names the pipe it came from) and sends each step's outputs
and refusals to the pipe of the worker that added each request, the live statistics to every
worker. Messages are pickled tuples
(protocol 5); a TokenOutput travels as a plain tuple of its fields, cheaper to pickle than the
dataclass.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import pickle
from dataclasses import dataclass

from sglaunch.engine.interface import TokenOutput, token_output

# commands, server -> engine: (ADD, request[, pipe]), (ABORT, rid), (SHUTDOWN,), and from the
# launcher (DROP, pipe): abort every request of a worker that died
ADD, ABORT, SHUTDOWN, DROP = "add", "abort", "shutdown", "drop"
# (FLUSH_CACHE, token[, pipe]): empty the prefix cache if no request runs or waits; answered on
# that pipe by (FLUSHED, token, result, live): LLMEngine.flush_cache's dict (or {"flushed":
# False, "error": why} when it raised) and the live statistics after it
FLUSH_CACHE, FLUSHED = "flush_cache", "flushed"
# events, engine -> server
READY, FAILED, STEP, STOPPED = "ready", "failed", "step", "stopped"
# a refusal in a STEP event: the request ends with ValueError (a 400) or RuntimeError (a 500)
REFUSED, ERROR = "refused", "error"

_OUTPUT_FIELDS = tuple(f.name for f in dataclasses.fields(TokenOutput))
_output_tuple = operator.attrgetter(*_OUTPUT_FIELDS)


@dataclass(frozen=True)
class Endpoints:
    """Where the pipes live, and where a dying engine leaves its last words.

    `workers` 0: one pipe pair (the server's); N: the owner's pair 0, then one per HTTP worker."""

    folder: str
    workers: int = 0

    @property
    def pipes(self) -> int:
        return 1 + self.workers

    def commands_of(self, pipe: int) -> str:
        return self._path("commands", pipe)

    def events_of(self, pipe: int) -> str:
        return self._path("events", pipe)

    def _path(self, name: str, pipe: int) -> str:
        return f"ipc://{os.path.join(self.folder, name if pipe == 0 else f'{name}-{pipe}')}"

    @property
    def commands(self) -> str:
        return self.commands_of(0)

    @property
    def events(self) -> str:
        return self.events_of(0)

    @property
    def last_words(self) -> str:
        return os.path.join(self.folder, "last-words")


def encode(message: tuple) -> bytes:
    return pickle.dumps(message, protocol=5)


def decode(buffer) -> tuple:
    return pickle.loads(buffer)


def pack_outputs(outputs: list[TokenOutput]) -> list[tuple]:
    return [_output_tuple(out) for out in outputs]


def unpack_output(fields: tuple) -> TokenOutput:
    """TokenOutput(*fields) at less than half the cost (interface.token_output, which skips the
    frozen dataclass's per-field __init__; one per output on the server's receive path). Equal to
    TokenOutput(*fields) in every respect."""
    return token_output(*fields)
