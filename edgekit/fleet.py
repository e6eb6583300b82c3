"""A fleet of boards: ``fleet.toml`` lists them, :func:`run_fleet` flashes or smoke-tests bundles on the matching
ones concurrently (threads: the work is waiting on the boards), with a bound on parallel connections, a timeout and
retries per board, and one outcome per board. One board's failure never stops the others.

    [[boards]]
    name = "orin-1"
    board = "nvidia/jetson-orin-nano-8gb"   # board profile: a bundle goes to the boards it was built for
    transport = "ssh"                       # ssh | adb | local
    address = "ubuntu@10.0.0.7:22"          # ssh: user@host[:port]; adb: the device serial (or none); local: none
    key = "~/.ssh/lab_ed25519"              # ssh private key (relative paths: from fleet.toml's folder)
    tags = ["lab-a"]
"""

from __future__ import annotations

import threading
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from edgekit.errors import EdgekitError

ACTIONS = ("flash", "smoke")


class FleetError(EdgekitError):
    """fleet.toml is missing or wrong, or no board of the fleet matches."""


class FleetBoard(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    board: str = Field(description="board profile id, e.g. nvidia/jetson-orin-nano-8gb (`edgekit boards`)")
    transport: Literal["ssh", "adb", "local"] = "ssh"
    address: str | None = None
    key: str | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    adb_server: str | None = None
    dest: str | None = None  # bundle folder on the board (default ~/edgekit/<bundle name>)
    python: str | None = None  # python on the board for the smoke test (default: the manifest's, else python3)
    tags: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _address(self) -> FleetBoard:
        if self.transport == "ssh" and not self.address:
            raise ValueError("an ssh board needs address = \"user@host[:port]\"")
        if self.transport == "local" and self.address:
            raise ValueError("a local board takes no address (it is this machine)")
        return self

    def host(self) -> str:
        """The address as `--host` reads it (edgekit.transports.parse_address)."""
        if self.transport == "local":
            return "local"
        if self.transport == "adb":
            return f"adb:{self.address}" if self.address else "adb"
        return self.address or ""


class Fleet(BaseModel):
    model_config = ConfigDict(extra="forbid")
    boards: list[FleetBoard] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Fleet:
        names = [b.name for b in self.boards]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"board names must be unique; repeated: {', '.join(dup)}")
        return self

    def select(self, tags: list[str] | None) -> list[FleetBoard]:
        """The boards carrying every one of ``tags`` (all boards without tags)."""
        return [b for b in self.boards if set(tags or []) <= set(b.tags)]


def load_fleet(path: str | Path) -> Fleet:
    """Read and check fleet.toml: unknown keys, missing fields and unknown board profiles are one-line errors."""
    from edgekit.profiles import _fmt_validation, resolve_board_name

    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise FleetError(f"{path}: no such file; give --fleet FLEET.toml (its format: docs/flash.md, Fleet)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FleetError(f"{path}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise FleetError(f"{path}: not valid TOML ({exc}); fix the file") from None
    try:
        fleet = Fleet.model_validate(data)
    except ValidationError as exc:
        raise FleetError(_fmt_validation(path, exc, "fleet file")) from None
    for b in fleet.boards:
        try:
            b.board = resolve_board_name(b.board)
        except EdgekitError as exc:
            raise FleetError(f"{path}: board {b.name!r}: {exc}") from None
        for attr in ("key", "known_hosts"):  # paths are read from the fleet file's folder
            val = getattr(b, attr)
            if val and not Path(val).expanduser().is_absolute():
                setattr(b, attr, str(path.parent / val))
    return fleet


@dataclass
class Outcome:
    """One board's run: its bundles' results, or the one-line reason it failed."""

    board: FleetBoard
    bundles: list[str]  # the bundle names it got
    passed: bool = False
    reason: str | None = None  # why it failed (one line), or why it was skipped
    skipped: bool = False  # no bundle was built for this board's profile
    attempts: int = 0
    seconds: float = 0.0
    host: str = ""  # the transport's own description
    flashed: list[Any] = field(default_factory=list)  # edgekit.flash.FlashResult per bundle
    smoked: list[Any] = field(default_factory=list)  # edgekit.smoke.SmokeResult per bundle


# on_event(board name, what, detail): "start", "attempt", "bundle", "file", "bytes", "done"
OnEvent = Callable[[str, str, Any], None]


def run_fleet(action: str, bundles: list[Any], fleet: Fleet, tags: list[str] | None = None, max_parallel: int = 4,
              timeout: float | None = 600, retries: int = 1, on_event: OnEvent = lambda n, w, d: None,
              on_file: Callable[[str, str, int], Callable[[int], None] | None] | None = None) -> list[Outcome]:
    """``action`` ("flash" or "smoke") for each bundle (edgekit.bundle.Unpacked) on every fleet board carrying
    ``tags`` that the bundle was built for, ``max_parallel`` boards at a time. A board that fails is retried
    ``retries`` times (a flash resumes where it stopped); ``timeout`` bounds each attempt (the board's connection
    is cut at it). Returns one Outcome per selected board, in fleet order."""
    if action not in ACTIONS:
        raise ValueError(f"unknown fleet action {action!r}")
    if max_parallel < 1:
        raise FleetError(f"--max-parallel {max_parallel}: give at least 1")
    if retries < 0:
        raise FleetError(f"--retries {retries}: give 0 or more")
    if timeout is not None and timeout <= 0:
        raise FleetError(f"--timeout {timeout}: give the seconds one board may take, more than 0")
    chosen = fleet.select(tags)
    if not chosen:
        raise FleetError(f"no board of the fleet carries the tag(s) {', '.join(tags or [])}; its tags: "
                         + ", ".join(sorted({t for b in fleet.boards for t in b.tags})))
    outcomes = []
    for b in chosen:
        mine = [ub for ub in bundles if ub.manifest.board.id == b.board]
        o = Outcome(b, [ub.manifest.name for ub in mine])
        if not mine:
            o.skipped, o.reason = True, f"no bundle built for {b.board}"
        outcomes.append((o, mine))
    if all(o.skipped for o, _ in outcomes):
        built = sorted({ub.manifest.board.id for ub in bundles})
        raise FleetError(f"no bundle matches a selected board: the bundles are for {', '.join(built)}, the boards "
                         f"are {', '.join(sorted({b.board for b in chosen}))}")

    def work(o: Outcome, mine: list[Any]) -> None:
        t0 = time.perf_counter()
        on_event(o.board.name, "start", None)
        for attempt in range(retries + 1):
            o.attempts = attempt + 1
            on_event(o.board.name, "attempt", o.attempts)
            o.flashed, o.smoked = [], []
            try:
                _attempt(action, o, mine, timeout, on_event, on_file)
                o.passed, o.reason = all(s.passed for s in o.smoked), None
                if not o.passed:
                    o.reason = "; ".join(_smoke_reason(s) for s in o.smoked if not s.passed)
                break  # a smoke test that ran and failed is the board's answer: not retried
            except EdgekitError as exc:
                from edgekit.quiet import first_line

                o.reason = first_line(exc, 300)
                if attempt < retries:
                    time.sleep(min(2.0 ** attempt, 10.0))
        o.seconds = time.perf_counter() - t0
        on_event(o.board.name, "done", o)

    with ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="edgekit-fleet") as pool:
        futures = [pool.submit(work, o, mine) for o, mine in outcomes if not o.skipped]
        for f in futures:
            f.result()  # a bug in a worker is not swallowed
    return [o for o, _ in outcomes]


def _attempt(action: str, o: Outcome, mine: list[Any], timeout: float | None, on_event: OnEvent,
             on_file: Callable[[str, str, int], Callable[[int], None] | None] | None) -> None:
    """One attempt on one board: open its transport, then flash or smoke each of its bundles, within ``timeout``
    (at the deadline the connection is closed from a timer, which ends whatever the board was doing)."""
    from edgekit.flash import flash
    from edgekit.smoke import smoke
    from edgekit.transports import open_transport

    b = o.board
    deadline = None if timeout is None else time.monotonic() + timeout
    with open_transport(b.host(), key=b.key, known_hosts=b.known_hosts, accept_new_host_key=b.accept_new_host_key,
                        adb_server=b.adb_server, timeout=min(15.0, timeout or 15.0)) as tr:
        o.host = tr.describe()
        timer = threading.Timer(timeout, tr.close) if timeout is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            for ub in mine:
                on_event(b.name, "bundle", ub.manifest.name)
                if action == "flash":
                    cb = (lambda rel, size: on_file(b.name, rel, size)) if on_file else None
                    o.flashed.append(flash(ub, tr, dest=b.dest, on_file=cb))
                else:
                    left = None if deadline is None else max(1.0, deadline - time.monotonic())
                    o.smoked.append(smoke(ub, tr, dest=b.dest, python=b.python, timeout=left))
        except EdgekitError as exc:
            if deadline is not None and time.monotonic() >= deadline:
                raise FleetError(f"timed out after {timeout:g} s ({exc})") from None
            raise
        finally:
            if timer is not None:
                timer.cancel()


def _smoke_reason(s: Any) -> str:
    failed = [c["name"] for c in s.checks if c.get("passed") is False]
    return f"smoke failed: {', '.join(failed) or f'runner exit {s.exit_code}'}"
