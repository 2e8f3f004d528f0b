"""Our side of the NFQUEUE daemon: start it in the bridge's namespace, watch it, stop it.

A dead daemon (no ``--queue-bypass``, see `netem.rules`) drops every packet of its links, so
`failures()` looks from two sides: the process has exited, or the kernel lists a queue of ours
without a listener (``/proc/PID/net/netfilter/nfnetlink_queue``); `drop_warnings()` reports packets the
kernel dropped because a queue was full (the queue was sized too small for packets/s x delay).
"""

from __future__ import annotations

from dataclasses import dataclass

from netem.child import Child, ChildError
from netem.spec import DirectionSpec

MODULE = "netem.nfqueue_daemon"


class DaemonDied(ChildError):
    """The NFQUEUE daemon is gone: its links drop every packet."""


@dataclass(frozen=True)
class QueueAssignment:
    queue_num: int
    label: str  # "edge3/up"
    direction: DirectionSpec
    limit_pkts: int
    backlog_pkts: int
    seed: int
    reinject: bool = False  # packets a local socket sends: copied, dropped, the copy sent later

    def as_config(self) -> dict:
        return {
            "queue_num": self.queue_num,
            "label": self.label,
            "direction": self.direction.as_dict(),
            "limit_pkts": self.limit_pkts,
            "backlog_pkts": self.backlog_pkts,
            "seed": self.seed,
            "reinject": self.reinject,
        }


@dataclass(frozen=True)
class QueueStatus:
    """One line of /proc/net/netfilter/nfnetlink_queue."""

    queue_num: int
    portid: int  # the listening netlink socket
    held_pkts: int  # waiting for a verdict right now
    queue_dropped: int  # dropped by the kernel: the queue was full
    user_dropped: int  # dropped by the kernel: our socket's buffer was full


class NfqueueDaemon:
    def __init__(self, child: Child, netns: str | None, queues: list[QueueAssignment]):
        self.child = child
        self.netns = netns
        self.queues = queues

    @classmethod
    def start(
        cls,
        netns: str | None,
        queues: list[QueueAssignment],
        tag: str,
        rt_priority: int = 10,
        ready_timeout_s: float = 15.0,
        reinject_mark: int = 0,
    ) -> NfqueueDaemon:
        """``reinject_mark``: the firewall mark of the copies a reinject queue sends (its rule
        must skip packets carrying it)."""
        if any(q.reinject for q in queues) and not reinject_mark:
            raise ValueError("reinject_mark must be a non-zero firewall mark when a queue reinjects")
        config = {
            "queues": [q.as_config() for q in queues],
            "rt_priority": rt_priority,
            "control": True,
            "reinject_mark": reinject_mark,
        }
        try:
            child = Child.start(MODULE, config, tag=tag, netns=netns, ready_timeout_s=ready_timeout_s, keep_stdin=True)
        except ChildError as exc:
            raise DaemonDied(f"NFQUEUE daemon failed to start: {exc}") from None
        return cls(child, netns, queues)

    @property
    def pid(self) -> int:
        return self.child.pid

    def queue_status(self) -> dict[int, QueueStatus]:
        """The kernel's view of our queues (empty when the daemon is gone)."""
        try:
            with open(f"/proc/{self.pid}/net/netfilter/nfnetlink_queue") as f:
                text = f.read()
        except (FileNotFoundError, ProcessLookupError):
            return {}
        status = {}
        for line in text.splitlines():
            fields = [int(x) for x in line.split()]
            status[fields[0]] = QueueStatus(
                queue_num=fields[0],
                portid=fields[1],
                held_pkts=fields[2],
                queue_dropped=fields[5],
                user_dropped=fields[6],
            )
        return status

    def failures(self) -> list[str]:
        """Why some link now drops every packet; empty while all is well."""
        if not self.child.alive():
            return [
                f"NFQUEUE daemon (pid {self.pid}) died with exit code {self.child.proc.returncode}; "
                f"its links now drop every packet. Log: {self.child.log_tail(500)!r}"
            ]
        status = self.queue_status()
        return [
            f"queue {q.queue_num} ({q.label}) has no listener: its link drops every packet"
            for q in self.queues
            if q.queue_num not in status
        ]

    def drop_warnings(self) -> list[str]:
        """Packets the kernel dropped because a queue or socket was full (not the configured loss)."""
        status = self.queue_status()
        return [
            f"queue {s.queue_num}: kernel dropped {s.queue_dropped} (queue full) + {s.user_dropped} "
            f"(socket full) packets; raise max_pps"
            for s in status.values()
            if s.queue_num in {q.queue_num for q in self.queues} and (s.queue_dropped or s.user_dropped)
        ]

    def schedule(self, changes: list[tuple[float, int, DirectionSpec]], keep_order: bool = False) -> None:
        """Switch queues' settings at given times: (CLOCK_MONOTONIC seconds, queue_num, settings).
        The daemon times each switch itself (see netem.nfqueue_daemon); keep_order: packets after
        a switch never overtake those held before it (netem.model)."""
        ours = {q.queue_num for q in self.queues}
        for _, queue_num, _ in changes:
            if queue_num not in ours:
                raise ValueError(f"queue {queue_num} is not served by this daemon (it serves {sorted(ours)})")
        self.child.send(
            {
                "changes": [
                    {"at_mono_s": at_s, "queue_num": q, "direction": d.as_dict(), "keep_order": bool(keep_order)}
                    for at_s, q, d in changes
                ]
            }
        )

    def check(self) -> None:
        failures = self.failures()
        if failures:
            raise DaemonDied("; ".join(failures))

    def stop(self) -> dict | None:
        return self.child.stop()
