"""The stub engine of the kill -9 matrix, as a process of its own (so the monitor's watch
loop can follow its pid like an engine's): tests/sse_stub.py's OpenAI server, streaming
`--token-delay` seconds apart and answering a whole (batch) request after `--delay`.
`python -m tests.faults.engine_stub --token-delay 0.02 --delay 0.1` prints `PORT <n>`."""
import argparse
import asyncio

from tests.sse_stub import StubScript, StubServer, serve_forever


class SlowStub(StubServer):
    def __init__(self, script, delay):
        super().__init__(script)
        self.delay = delay

    async def _complete(self, body, chat, writer):
        if not body.get("stream"):
            await asyncio.sleep(self.delay)
        return await super()._complete(body, chat, writer)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--token-delay", type=float, default=0.02)
    parser.add_argument("--delay", type=float, default=0.1)
    args = parser.parse_args()
    serve_forever(SlowStub(StubScript(token_delay=args.token_delay), args.delay))


if __name__ == "__main__":
    main()
