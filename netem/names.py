"""Names of everything we create, so `cleanup_leftovers` can find it after a crash.

Every kernel object carries the prefix: network namespaces ``dsdbed-<tag>-<role>``, iptables
chains ``DSDBED-<tag>``, interfaces ``dsdb...`` (at most 15 characters, the kernel's limit), root
qdiscs the handle majors below, child processes a ``--tag dsdbed-<tag>`` argument.
"""

from __future__ import annotations

import os
import re

PREFIX = "dsdbed"
CHAIN_PREFIX = "DSDBED-"
IFNAME_PREFIX = "dsdb"
IFNAME_MAX_CHARS = 15
# A qdisc has no name, only a 16-bit handle major: these two are our "prefix" for qdiscs.
QDISC_MAJOR_RATE = 0xD5DB
QDISC_MAJOR_NETEM = 0xD5DC
OUR_QDISC_MAJORS = (QDISC_MAJOR_RATE, QDISC_MAJOR_NETEM)

_TAG_RE = re.compile(r"^[a-z0-9]{1,12}$")


def new_tag() -> str:
    """A short random run tag: namespaces of concurrent runs must not collide."""
    return os.urandom(3).hex()


def check_tag(tag: str) -> str:
    # The tag ends up in netns names, chain names (28 chars max) and argv: keep it tame.
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        raise ValueError(f"tag must be 1-12 lowercase letters/digits, got {tag!r}")
    return tag


def netns_name(tag: str, role: str) -> str:
    return f"{PREFIX}-{check_tag(tag)}-{role}"


def chain_name(tag: str) -> str:
    return f"{CHAIN_PREFIX}{check_tag(tag)}"


def process_tag(tag: str) -> str:
    """The marker a child process carries in its argv."""
    return f"{PREFIX}-{check_tag(tag)}"


def check_ifname(name: str) -> str:
    if not name.startswith(IFNAME_PREFIX) or len(name) > IFNAME_MAX_CHARS:
        raise ValueError(
            f"interface name must start with {IFNAME_PREFIX!r} and have at most "
            f"{IFNAME_MAX_CHARS} characters, got {name!r}"
        )
    return name


def qdisc_handle(major: int, minor: int = 0) -> int:
    return (major << 16) | minor
