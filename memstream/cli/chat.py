"""`memstream chat`: talk to the persona in the terminal. Each line is observed and answered, and the answer is
remembered while the user reads; lines starting with / are the shell's own commands, never stored."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from memstream.cli.handlers import OnMemory
from memstream.cli.options import Parents
from memstream.cli.shell import STEPS, spinner_wanted, why_lines
from memstream.cli.spinner import Spinner
from memstream.errors import BudgetSpent, ProviderError, StoreFull, StoreLocked
from memstream.exits import Interrupted
from memstream.render import scored_json
from memstream.text import visible

if TYPE_CHECKING:
    from memstream.cli.options import Subparsers
    from memstream.replying import Reply, ReplyDraft
    from memstream.stream import MemoryStream

__all__ = ["CHAT_HELP", "add_parsers", "cmd_chat"]

CHAT_HELP = ("/help  these commands\n/why   what the last reply was built from\n/quit  leave (or Ctrl-D, Ctrl-C)\n"
             "Anything else is said to the persona. Lines starting with / are never stored.")


async def cmd_chat(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Talk to the persona: each line is observed and answered; /commands are the shell's own."""
    tty = sys.stdin.isatty()
    with _terminal_kept(tty):
        if tty:
            with contextlib.suppress(ImportError):  # line editing and history for input(), where the platform has it
                import readline  # noqa: F401
        print(f"Talking to {memory.name} (stream {args.stream!r}). /help for commands, Ctrl-D to leave.",
              file=sys.stderr)
        session = _Session(memory, args, Spinner(spinner_wanted(args.json)))
        try:
            while await session.turn(await _read_line(f"{args.speaker}> " if tty else None), tty=tty):
                pass
        except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C: run_to_exit cancels the command
            what = session.interrupted()
            if tty:
                print(file=sys.stderr)
            if what is None:
                raise
            raise Interrupted(what) from None
    return 0


@contextlib.contextmanager
def _terminal_kept(tty: bool) -> Iterator[None]:
    """The terminal's settings as they were, however the chat ends: line editing (readline) changes them while
    it reads a line, and a Ctrl-C ends the program in the middle of that read."""
    saved = None
    if tty:
        with contextlib.suppress(ImportError, OSError):  # termios: not on Windows
            import termios

            saved = termios.tcgetattr(sys.stdin.fileno())
    try:
        yield
    finally:
        if saved is not None:
            with contextlib.suppress(OSError):  # the terminal is gone
                termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)


class _Session:
    """One conversation: the last reply (for /why), and its rating and embedding while the user reads."""

    def __init__(self, memory: MemoryStream, args: argparse.Namespace, spin: Spinner) -> None:
        self.memory, self.args, self.spin = memory, args, spin
        self.last: Reply | None = None
        self.draft: ReplyDraft | None = None
        self.remembering: asyncio.Future[None] | None = None
        self.step: str | None = None  # what respond is doing, while it answers

    async def turn(self, line: str | None, *, tty: bool) -> bool:
        """Handle one line of input; False once the user leaves."""
        if line is None:  # Ctrl-D: leave the shell's prompt on a line of its own
            if tty:
                print(file=sys.stderr)
            await self.settle()
            return False
        text = line.strip()
        if text.startswith("/"):
            return await self.command(text)
        if text:
            await self.say(text)
        return True

    async def command(self, text: str) -> bool:
        """A /command; False for /quit."""
        if text in ("/quit", "/exit"):
            await self.settle()
            return False
        if text == "/help":
            print(CHAT_HELP, file=sys.stderr)
        elif text == "/why":
            await self.settle()
            print(visible("\n".join(await why_lines(self.memory, self.last))))
        else:
            print(f"unknown command {visible(text.split()[0])}: /help lists them", file=sys.stderr)
        return True

    async def say(self, text: str) -> None:
        """Say a line to the persona and print its reply as it comes; the reply is remembered while the user
        reads. A turn the model server (or a busy or full disk) fails is one line, and the chat goes on."""
        args = self.args
        try:
            with self.spin:
                await _remembered(self.remembering, self.spin)
                self.remembering = None
                self.step = "observing"
                self.draft = await self.memory.start_reply(text, stream=args.stream, speaker=args.speaker,
                                                           at=args.at, on_step=self._show)
                await self._written(self.draft)
            self.step = None
            self.last = last = await self.draft.finish()
        except BudgetSpent as exc:  # the persona file's [budget]: no call made, the line is kept
            self.step = None
            print(visible(f"memstream: {self.memory.name} gives no reply, {exc}; your line is kept"),
                  file=sys.stderr, flush=True)
            return
        except (ProviderError, StoreLocked, StoreFull) as exc:
            self.step = None
            print(visible(f"memstream: this turn failed: {exc}"), file=sys.stderr, flush=True)
            return
        except asyncio.CancelledError:  # Ctrl-C: what was shown of the reply is what the persona said
            if self.draft is not None and self.draft.text.strip() and self.step == "writing":
                self.last = await self.draft.finish(self.draft.text)
            raise
        self.remembering = asyncio.ensure_future(self.memory.reply_sent(last, []))
        if args.json:
            print(json.dumps({"reply": last.text, "trace": last.trace_id, "cut": last.cut,
                              "memories": [scored_json(m, i) for i, m in enumerate(last.memories, 1)]}))
        elif self.draft is not None and self.draft.cut is not None:
            print(visible(f"memstream: the reply was cut off ({self.draft.cut}); what was shown is remembered"),
                  file=sys.stderr, flush=True)

    async def _written(self, draft: ReplyDraft) -> None:
        """Print the reply as the model writes it (with --json: nothing until it is whole)."""
        out = sys.stdout
        async for piece in draft.deltas():
            if self.args.json:
                continue
            if self.step != "writing":
                self.step = "writing"
                self.spin.stop()
                out.write(visible(f"{self.memory.name}: "))
            out.write(visible(piece))
            out.flush()
        if not self.args.json:
            out.write("\n" if self.step == "writing" else visible(f"{self.memory.name}: ") + "\n")
            out.flush()

    def _show(self, step: str) -> None:
        self.step = step
        self.spin.show(STEPS[step])

    async def settle(self) -> None:
        """Wait, with the spinner, until the last reply is remembered."""
        with self.spin:
            await _remembered(self.remembering, self.spin)

    def interrupted(self) -> str | None:
        """Ctrl-C: what it interrupted (None: nothing, the prompt). The last reply, if still being remembered,
        is left pending (the next command completes it)."""
        self.spin.stop()
        if self.step == "writing":
            return "the reply so far is remembered, cut off (a pending memory: the next command completes it)"
        if self.step is not None:
            return ("your line is remembered; there was no reply" if self.step in ("retrieving", "answering")
                    else "there was no reply; your line was being stored, and is kept if it was (pending)")
        if self.remembering is not None and not self.remembering.done():
            self.remembering.cancel()
            return "the last reply is kept as a pending memory (the next command completes it)"
        return None


async def _remembered(remembering: asyncio.Future[None] | None, spin: Spinner) -> None:
    """Wait for the last reply to be rated and embedded (it runs while the user reads and types)."""
    if remembering is not None and not remembering.done():
        spin.show(STEPS["remembering"])
    if remembering is not None:
        await remembering


async def _read_line(prompt: str | None) -> str | None:
    """One line of input, None at end of input. Read on a daemon thread: Ctrl-C ends the program at once
    instead of waiting for the blocked read (an executor thread would keep the process alive until Enter)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str | None] = loop.create_future()

    def read() -> None:
        value: str | None = None
        failure: BaseException | None = None
        try:
            value = input(prompt) if prompt is not None else sys.stdin.readline() or None
        except EOFError:
            value = None
        except Exception as exc:  # handed to the waiting coroutine
            failure = exc

        def hand_over() -> None:
            if not done.done():
                if failure is not None:
                    done.set_exception(failure)
                else:
                    done.set_result(value)

        with contextlib.suppress(RuntimeError):  # the loop is gone: the program is ending
            loop.call_soon_threadsafe(hand_over)

    threading.Thread(target=read, name="chat-input", daemon=True).start()
    return await done


def add_parsers(sub: Subparsers, shared: Parents) -> None:
    """chat."""
    p = sub.add_parser("chat", parents=[shared.common, shared.scoped, shared.timed],
                       help="talk to the persona in the terminal",
                       description="Talk to the persona: each line you type is observed and answered.")
    p.add_argument("--as", dest="speaker", default="You", help="your name in the persona's memory")
    p.set_defaults(handler=OnMemory(cmd_chat, models=True))
