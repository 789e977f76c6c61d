"""A blocking write lock in a file beside the SQLite database: writers wait in the kernel, in turn.

Invariant: this lock only orders writers so none sleeps while the database is free (SQLite's busy
handler sleeps in growing steps and lets newcomers overtake); SQLite's own locking stays the
correctness guarantee. Where no lock file can be used (`:memory:`, URI databases, a directory we
may not write and no lock file yet, a symlink or other non-regular file in its place) the lock
degrades to nothing and SQLite's busy timeout alone decides, as before.

Each acquisition opens its own file description and takes `flock(LOCK_EX)` on it, so threads of
one process contend like processes do, and the kernel drops the lock of a process that dies. A
contended wait blocks in a helper thread while the caller waits on an Event (the hand-over wakes
it; it is never polled for); a waiter given up on releases the lock itself if it ever gets it.

Busy means *held*, not *queued*: every holder bumps a turn counter in the lock file, and a waiter
gives up only when a whole busy timeout passes without the lock changing hands while someone holds
it. A long queue that keeps moving (a burst of cron jobs on a starved CPU) never fails; a stuck
holder still does.

First come, first served: `flock` alone wakes its waiters in no fixed order and lets a newcomer
take a lock that was just released before the woken waiter runs, so a writer could be overtaken
again and again. Where open-file-description byte-range locks exist (Linux), a writer first
takes a ticket (a counter in the file, incremented under a byte lock held for microseconds),
locks the byte of its own ticket, and waits for the byte of the ticket before it; the holder lets
its byte go after the `flock`, so the next ticket runs next. A writer that dies anywhere in the
queue drops its bytes with its descriptor and the queue moves on; `flock` alone still decides
who writes, so the order is only an order (an older `ledger` that takes just the `flock` is
still kept out, it merely does not queue).

A writer stopped or starved while it is next (Ctrl-Z, a debugger, a frozen container) would stall
everyone behind it: while nothing changes hands, a waiting caller looks every `_STALL_S` whether
the `flock` is free, and after two such looks in a row takes it outside the queue on a new
description; its place in the queue is let go by its helper thread once that gets through.
Until then that place is kept for the process's next write, which takes the waiting helper over
instead of queueing anew: a writer stalled for good costs a long-lived process one waiting
thread and descriptor, not one more per write.

The stall is passed over once for everyone (issue 29 item 10): the writer that goes around it
records the next ticket to be drawn in the file (the *pass* mark), and the writer that draws
that ticket does not wait for the one before it: the queue starts again behind it, in order,
and no later write pays the stall pass again. A place taken before the mark is behind the
stalled writer, so it is not taken over either (its helper finishes on its own).

The caller itself never blocks in the kernel: it takes the ticket counter's guard and its own
ticket's byte without waiting, so whatever the file holds (truncated or rewritten under queued
writers, which restarts the counter onto tickets still held) the wait stays bounded by the busy
timeout. A ticket whose byte is still held is skipped; with no free one the order is dropped for
that write and `flock` alone decides.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ledger.errors import BusyError
from ledger.home import sqlite_file

LOCK_SUFFIX = "-writelock"
_OPEN_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang open

# Descriptors of this process's lock files (held or awaited): closed in a forked child, which
# must not keep the parent's lock alive nor hand it to itself.
_OPEN_FDS: set[int] = set()
_FDS_GUARD = threading.Lock()
# Waiters given up on that are still in the queue, by lock file: the next write of this process
# takes one over (its place, thread and descriptor) instead of queueing anew, so a writer stalled
# ahead for good costs a process one waiting thread, not one more per write.
_IDLE: dict[Path, list[_Waiter]] = {}
_IDLE_GUARD = threading.Lock()


def lock_path(url: str) -> Path | None:
    """The lock file for a database URL, or None where SQLite's own locking must do."""
    path = sqlite_file(url)
    return None if path is None else path.with_name(path.name + LOCK_SUFFIX)


def _open(path: Path) -> int | None:
    """A new descriptor on the lock file (created 0600), or None when it cannot be used."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o600)
    except OSError:
        try:  # a read-only directory or file: flock works on a read-only descriptor too
            fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
        except OSError:
            return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    with _FDS_GUARD:
        _OPEN_FDS.add(fd)
    return fd


def _close(fd: int) -> None:
    """Close a lock descriptor (which releases the lock) unless a fork already closed it."""
    with _FDS_GUARD:
        if fd not in _OPEN_FDS:
            return
        _OPEN_FDS.discard(fd)
    os.close(fd)


def _forget_in_child() -> None:
    global _FDS_GUARD, _IDLE_GUARD
    _FDS_GUARD = threading.Lock()  # a thread of the parent may have held it at fork time
    _IDLE_GUARD = threading.Lock()
    _IDLE.clear()  # their threads did not come along
    for fd in list(_OPEN_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _OPEN_FDS.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def passed_over(fd: int, ticket: int | None) -> bool:
    """Whether a place with `ticket` was taken before the last stall pass (it waits behind a
    writer that was gone around)."""
    mark = _count(fd, _PASS_AT)
    return ticket is not None and ticket < mark <= ticket + _SLOTS


class _Waiter:
    """A helper thread that waits out the rest of the queue (its turn, then the flock); whoever
    loses the race (caller or thread) releases. A waiter given up on stays in `_IDLE` until a
    later write takes it over or it gets through (and then releases at once).

    A signal (Ctrl-C) can raise in the caller at any call it makes, so the caller's `give_up`
    covers every state the wait can be in: the thread not started yet or not yet waiting (the
    caller closes the descriptor), waiting (the thread closes it once it gets through), or
    through (the caller closes it)."""

    def __init__(self, path: Path, fd: int, place: _Place) -> None:
        self.path = path
        self.fd = fd
        self.place = place
        self.granted = threading.Event()
        self.failed = False
        self.abandoned = False
        self.started = False  # its thread was started (by the first `wait`)
        self.running = False  # its thread waits on the descriptor: only it may close it now
        self.settled = False  # given up on: the descriptor closed, or left to the thread
        self.mutex = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="ledger-writelock", daemon=True)

    @classmethod
    def adopt(cls, path: Path) -> _Waiter | None:
        """A waiter of this process given up on but still in the queue of `path`, now ours."""
        while True:
            with _IDLE_GUARD:
                idle = _IDLE.get(path)
                if not idle:
                    return None
                waiter = idle.pop()
            try:
                with waiter.mutex:
                    # else it got through and released meanwhile, or the file it queues on was
                    # replaced (it is left to finish on the old one; writers now queue on the new)
                    if waiter.abandoned and _same_file(waiter.fd, path):
                        if passed_over(waiter.fd, waiter.place.ticket):
                            with _IDLE_GUARD:  # behind a stalled writer: left to finish alone
                                _IDLE.setdefault(path, []).insert(0, waiter)
                            return None
                        waiter.abandoned = waiter.settled = False
                        return waiter
            except BaseException:  # interrupted as it was taken over: left to its thread again
                waiter.give_up()
                raise

    def _abandon(self) -> None:
        """Give the wait up (mutex held): the thread releases if it ever gets through."""
        self.abandoned = self.settled = True
        with _IDLE_GUARD:
            _IDLE.setdefault(self.path, []).append(self)

    def give_up(self) -> None:
        """The caller stops waiting (a signal raised wherever the wait was): release what it
        holds now, or leave the descriptor to the thread, which releases once it gets through.
        Only the caller calls it, never after `wait` handed it the lock; a second call does
        nothing."""
        with self.mutex:
            if self.settled:
                return
            if self.running and not self.granted.is_set():
                self._abandon()
            else:  # its thread never began waiting, or got through: nobody else will release
                self.settled = True
                _close(self.fd)

    def _run(self) -> None:
        with self.mutex:
            if self.settled:  # given up on before it began: the caller closed the descriptor
                return
            self.running = True
        try:
            self.failed = not _advance(self.fd, self.place, block=True)
        except OSError:
            self.failed = True
        with self.mutex:
            if self.abandoned:
                self.abandoned = False  # done: never taken over now
                _close(self.fd)
                with _IDLE_GUARD:
                    idle = _IDLE.get(self.path, [])
                    if self in idle:
                        idle.remove(self)
                    if not idle:
                        _IDLE.pop(self.path, None)
                return
            self.granted.set()

    def wait(self, path: Path, timeout_s: float) -> tuple[int, bool] | None:
        """(descriptor, locked) once the lock is ours; None once it has not changed hands for
        `timeout_s` while someone holds it (busy). Starts the thread the first time. Whatever
        it raises (a signal), the caller calls `give_up`.

        While nothing changes hands the caller looks every `_STALL_S` whether the flock is free:
        free at two looks in a row means a writer ahead of us is stopped or starved in the queue,
        and we take the lock outside the queue (on a new description) rather than wait for it."""
        if not self.started:
            self.started = True
            self.thread.start()
        seen = turns(self.fd)
        moved = time.monotonic()
        step = min(_STALL_S, timeout_s)
        free_before = False  # the flock was free at the last look, and nothing moved since
        jumped: int | None = None  # the flock taken outside the queue, while ours to close
        try:
            while not self.granted.wait(step):
                now = turns(self.fd)
                if now != seen:
                    seen, moved, free_before = now, time.monotonic(), False
                    continue
                jumped = _flock_now(path)
                if jumped is not None and not free_before:
                    _close(jumped)  # free once may be a hand-over in flight: look again
                    jumped, free_before = None, True  # (a free lock is never `busy`)
                elif jumped is not None:
                    with self.mutex:
                        if not self.granted.is_set():
                            self._abandon()  # the thread lets its place go when it can
                            _mark_pass(jumped)  # the next writer goes around it, not one more
                            return jumped, True
                    _close(jumped)  # the queue answered meanwhile
                    jumped = None
                    break
                else:
                    free_before = False
                    if time.monotonic() - moved >= timeout_s:
                        break  # held, and nobody got it for a whole timeout: truly held
        except BaseException:  # a signal raised while the lock taken around the queue was ours
            if jumped is not None:
                _close(jumped)
            raise
        with self.mutex:
            if self.granted.is_set():
                return self.fd, not self.failed
            self._abandon()  # the thread closes the descriptor once it gets the lock
            return None


class WriteLock:
    """The write lock of one database (a no-op where `path` is None)."""

    def __init__(self, path: Path | None, timeout_ms: int) -> None:
        self.path = path
        self.timeout_s = timeout_ms / 1000

    def turns(self) -> int | None:
        """How many times the lock has been taken, or None where there is no lock file."""
        if self.path is None:
            return None
        try:
            fd = os.open(self.path, os.O_RDONLY | _OPEN_FLAGS)
        except OSError:
            return None
        try:
            return turns(fd)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def held(self) -> Iterator[bool]:
        """Hold the lock for the block; yields False when degraded to SQLite's locking alone.

        Raises BusyError when another writer holds it past the busy timeout.
        """
        path = self.path
        if path is None:
            yield False
            return
        owner = os.getpid()
        fd: int | None = None
        try:
            locked: bool | None = None
            waiter = _Waiter.adopt(path)  # this process's earlier place in the queue, if left
            if waiter is None:
                fd = _open(path)
                if fd is None:
                    yield False
                    return
                place = _Place()
                locked = _advance(fd, place, block=False)
                if locked is None:  # others are ahead or hold it: wait in turn
                    waiter = _Waiter(path, fd, place)
                    fd = None  # the waiter owns the descriptor until it hands the lock over
            if waiter is not None:
                try:
                    got = waiter.wait(path, self.timeout_s)
                except BaseException:  # Ctrl-C or another signal, wherever the wait was
                    waiter.give_up()
                    raise
                if got is None:
                    raise BusyError()
                fd, locked = got
            if locked:
                assert fd is not None
                take_turn(fd)
            yield bool(locked)
        finally:
            if fd is not None and os.getpid() == owner:
                _release(fd)


    @contextlib.contextmanager
    def held_if_free(self) -> Iterator[bool]:
        """Hold the lock for the block if it is free right now, else yield False at once: no
        wait and no place in the queue (for work that is worth doing only when no writer is
        mid-transaction: the WAL checkpoints of ledger/store/checkpoint.py). Counts a turn."""
        path = self.path
        fd = None if path is None else _flock_now(path)
        if fd is None:
            yield False
            return
        owner = os.getpid()
        try:
            take_turn(fd)
            yield True
        finally:
            if os.getpid() == owner:
                _release(fd)


# Little-endian 8-byte counters at the start of the lock file: turns, tickets, the pass mark.
_TURNS_AT = 0
_PASS_AT = 16  # the ticket drawn next when a stalled writer was last gone around


def _count(fd: int, at: int) -> int:
    """A counter's value, readable without holding anything (0 where it cannot be read)."""
    try:
        return int.from_bytes(os.pread(fd, 8, at), "little")
    except OSError:
        return 0


def _bump(fd: int, at: int) -> int:
    """Add one to a counter (its guard held by the caller); returns the value before."""
    value = _count(fd, at)
    os.pwrite(fd, ((value + 1) % 2**64).to_bytes(8, "little"), at)
    return value


def turns(fd: int) -> int:
    """How many times the lock has been taken (readable without holding it)."""
    return _count(fd, _TURNS_AT)


def take_turn(fd: int) -> None:
    """Count one more turn; only the holder calls it (a read-only descriptor just skips it)."""
    with contextlib.suppress(OSError):
        _bump(fd, _TURNS_AT)


_TICKETS = (8, 8)  # the ticket counter's bytes, also the byte lock that guards it
_SLOT_BASE = 4096  # ticket t waits on the byte _SLOT_BASE + (t - 1) % _SLOTS (past EOF is fine)
_SLOTS = 1 << 20
_DRAWS = 4096  # tickets tried for a free byte before giving up the order (microseconds each)
_STALL_S = 0.1  # no hand-over this long while the flock is free: a writer ahead has stalled
_OFD = getattr(fcntl, "F_OFD_SETLK", None), getattr(fcntl, "F_OFD_SETLKW", None)


class _Place:
    """One writer's place in the queue: its ticket once taken, and whether its turn came."""

    def __init__(self) -> None:
        self.ordered = None not in _OFD  # byte-range queue available (else flock alone)
        self.ticket: int | None = None
        self.turn = False


def _byte_lock(fd: int, kind: int, start: int, length: int, block: bool) -> bool:
    """An open-file-description lock on bytes of the file; False when it would block."""
    command = _OFD[1] if block else _OFD[0]
    assert command is not None
    try:
        fcntl.fcntl(fd, command, struct.pack("@hhqqi4x", kind, os.SEEK_SET, start, length, 0))
    except BlockingIOError:
        return False
    except OSError as error:
        if error.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def tickets(fd: int) -> int:
    """How many places in the queue have been handed out (readable without holding anything)."""
    return _count(fd, _TICKETS[0])


def _slot(ticket: int) -> int:
    return _SLOT_BASE + ticket % _SLOTS


def _advance(fd: int, place: _Place, *, block: bool) -> bool | None:
    """Take the next steps to the lock: ticket, turn, flock. True once held; None when a step
    would block (`block=False`); False when flock is unsupported here (SQLite alone decides).
    Only the wait for the writer ahead (and for the flock) ever blocks, and only with `block`."""
    if place.ordered and not place.turn:
        try:
            if place.ticket is None:
                if not _byte_lock(fd, fcntl.F_WRLCK, *_TICKETS, block):
                    return None
                try:
                    place.ticket = _draw(fd)
                    # the first place after a stall pass waits for nobody
                    place.turn = place.ticket is not None and place.ticket == _count(fd, _PASS_AT)
                finally:
                    _byte_lock(fd, fcntl.F_UNLCK, *_TICKETS, True)
            if place.ticket is None:
                place.ordered = False  # no free place (a mangled file): flock alone, unordered
            elif not place.turn:
                ahead = _slot(place.ticket - 1)
                if not _byte_lock(fd, fcntl.F_WRLCK, ahead, 1, block):
                    return None
                _byte_lock(fd, fcntl.F_UNLCK, ahead, 1, True)  # the one before us has gone
                place.turn = True
        except OSError:  # no byte-range locks here (read-only descriptor, odd filesystem)
            place.ordered = False  # flock alone still excludes; only the order is lost
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if block else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    except OSError:
        return False
    return True


def _draw(fd: int) -> int | None:
    """A ticket whose byte we now hold (the counter's guard held by the caller), never waiting
    for it: a byte still held belongs to a writer that drew the same ticket before the counter
    restarted (the file truncated or rewritten under queued writers) or wrapped; such tickets
    are skipped, so the counter moves past them. None after `_DRAWS` held bytes in a row."""
    for _ in range(_DRAWS):
        ticket = _bump(fd, _TICKETS[0])
        if _byte_lock(fd, fcntl.F_WRLCK, _slot(ticket), 1, False):
            return ticket
    return None


def _mark_pass(fd: int) -> None:
    """Record that a stalled writer was gone around (the lock held on `fd`): the ticket drawn
    next will not wait for the places before it. Under the counter's guard, never waiting for
    it (a drawer holds it for microseconds; missing one mark costs one more stall pass)."""
    if None in _OFD:
        return
    try:
        if not _byte_lock(fd, fcntl.F_WRLCK, *_TICKETS, False):
            return
        try:
            os.pwrite(fd, _count(fd, _TICKETS[0]).to_bytes(8, "little"), _PASS_AT)
        finally:
            _byte_lock(fd, fcntl.F_UNLCK, *_TICKETS, True)
    except OSError:  # no byte-range locks or a read-only descriptor: the order is only an order
        return


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is open on the file now at `path` (not one deleted or replaced since)."""
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _flock_now(path: Path) -> int | None:
    """The flock on a new description if it is free right now (outside the queue), else None."""
    fd = _open(path)
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        _close(fd)
        return None
    return fd


def _release(fd: int) -> None:
    """Let the flock go before our ticket's byte (closing drops byte locks first), so the next
    writer in turn finds the flock free; then close."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    _close(fd)
