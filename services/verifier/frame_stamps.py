"""When a frame reached a socket that the event loop did not read at once.

A service that runs a model pass on its event loop's own thread (services/verifier/scheduler.py,
``on_loop``) reads nothing meanwhile: a frame that arrives during the pass waits in the kernel
and would be stamped when it is read, up to a pass late. Right after such a pass the service asks
here whether bytes are waiting and since when: the kernel stamps every received segment
(SO_TIMESTAMPNS), and peeking one byte returns the stamp without consuming anything. So a
verification that came in during the pass counts its wait as queue time, and a ping's answer can
say how long it was held, as they would with the pass on a worker thread.

NOTE: on loopback the kernel merges segments that arrive back to back into one buffer, whose
stamp is then the latest one's; if two frames came in during one pass, the first is stamped as
late as the second (never earlier than it arrived). Where there is no timestamp (another OS, a
socket that refuses the option), the pass's start is used: the earliest the frame can have come.
"""

from __future__ import annotations

import array
import fcntl
import os
import socket
import struct
import termios
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; Python 3.11 does not name it
_TIMESPEC = struct.Struct("qq")  # struct timespec {tv_sec, tv_nsec}, 64-bit
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)


def watch(sock) -> socket.socket | None:
    """A handle on the connection's socket (a duplicate of its descriptor, closed by the caller)
    with kernel receive stamps on; None if the socket cannot give them."""
    if sock is None:
        return None
    try:
        watched = socket.socket(fileno=os.dup(sock.fileno()))
    except OSError:
        return None
    try:
        watched.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        pass  # no stamps: pending_since_s falls back to the pass's start
    return watched


def pending_since_s(watched: socket.socket | None, floor_s: float) -> float | None:
    """None if no byte is waiting on the socket; else when the first waiting one arrived, on
    perf_counter's clock, no earlier than ``floor_s`` (when the loop stopped reading)."""
    if watched is None:
        return None
    waiting = array.array("i", [0])
    try:
        fcntl.ioctl(watched.fileno(), termios.FIONREAD, waiting)
    except OSError:
        return None
    if waiting[0] <= 0:
        return None
    now_s = time.perf_counter()
    try:
        _, ancillary, _, _ = watched.recvmsg(1, _CMSG_SPACE, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return floor_s
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            arrived_s = seconds + nanoseconds * 1e-9 - (time.time() - time.perf_counter())
            return min(max(arrived_s, floor_s), now_s)
    return floor_s
