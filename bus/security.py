"""CURVE on the bus: key directories, socket options, and one ZAP authenticator per ZeroMQ context.

A key directory holds the cluster's certificates (written by ``sparkbus keys generate``)::

    KEY_DIR/public/<name>.key            public certificates: every key here may open a session
    KEY_DIR/private/<name>.key_secret    secret certificates (the directory is 0700)

A node uses ``<node id>`` if it has its own pair and the shared ``cluster`` pair otherwise; a connecting
node finds the server's public key the same way. A node id whose public key is in the directory is that
key's alone: the ZAP handler names each admitted connection by the file its key came from (ZeroMQ's
``User-Id`` of every message on it), and a node refuses a control message from routing id ``<node id>``
on a connection of another name (``key_owner``; docs/PROTOCOL.md section 3).

Server sockets (ROUTER, PULL) are CURVE servers with the
node's secret key; outgoing DEALER and PUSH are CURVE clients with the node's pair and the server's public
key.

ZAP: libzmq asks the handler bound at ``inproc://zeromq.zap.01`` of the socket's context to admit every
CURVE peer. One handler serves a context, and several nodes can share a process (the Spark driver,
tests), so each node registers a ZAP domain of its own (``sparkbus/<node id>``) with its allow-list of
client keys and of addresses, and a callback that counts and logs each refusal with the peer's address.
The handler starts with the context's first CURVE node, before its server sockets bind (libzmq admits
any client that knows the server key when no handler answers), and then lives as long as the context:
libzmq unbinds an inproc endpoint asynchronously, so a handler stopped and started again could find
``inproc://zeromq.zap.01`` still taken. A domain whose node has closed refuses everyone.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from sparkbus.bus.config import CurveSettings

log = logging.getLogger("sparkbus.bus.security")

#: The key pair a node without its own uses.
SHARED_NAME = "cluster"
PUBLIC = "public"
PRIVATE = "private"

#: Called with (peer address, reason) on the authenticator's thread.
Refused = Callable[[str, str], None]


class MissingKey(LookupError):
    """A key the node needs is not in the key directory."""


@dataclass(frozen=True)
class KeyPair:
    """Z85-encoded CURVE keys."""

    public: bytes
    secret: bytes


def _load(
    key_dir: str | os.PathLike[str], sub: str, name: str, suffix: str, what: str
) -> tuple[bytes, bytes | None]:
    """The certificate ``name`` uses in ``key_dir/sub``: its own, or the shared ``cluster`` one."""
    directory = Path(key_dir) / sub
    for candidate in (name, SHARED_NAME):
        path = directory / f"{candidate}{suffix}"
        if path.exists():
            return zmq.auth.load_certificate(path)
    raise MissingKey(
        f"no {what} in {directory} (expected {name}{suffix} or {SHARED_NAME}{suffix}; "
        "see `sparkbus keys generate`)"
    )


def node_keys(key_dir: str | os.PathLike[str], node_id: str) -> KeyPair:
    """The key pair ``node_id`` uses: its own, or the shared ``cluster`` pair."""
    public, secret = _load(key_dir, PRIVATE, node_id, ".key_secret", f"secret key for node {node_id!r}")
    if secret is None:
        raise MissingKey(f"the secret certificate of {node_id!r} in {key_dir} holds no secret key")
    return KeyPair(public=public, secret=secret)


def server_key(key_dir: str | os.PathLike[str], peer: str) -> bytes:
    """The public key of ``peer``'s server sockets: its own, or the shared ``cluster`` key."""
    return _load(key_dir, PUBLIC, peer, ".key", f"public key for peer {peer!r}")[0]


def generate(key_dir: str | os.PathLike[str], names: Iterable[str], *, overwrite: bool = False) -> list[Path]:
    """Write a key pair per name into ``key_dir`` (public/ and private/, private/ mode 0700).

    Returns:
        The files written.

    Raises:
        FileExistsError: a pair exists and ``overwrite`` is false (keys are never replaced by accident:
            every node holding the old public key would refuse the new one).
    """
    root = Path(key_dir)
    public_dir, private_dir = root / PUBLIC, root / PRIVATE
    names = list(names)
    for name in names:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad key name {name!r}: a node id or {SHARED_NAME!r}")
        exists = (public_dir / f"{name}.key").exists() or (private_dir / f"{name}.key_secret").exists()
        if exists and not overwrite:
            raise FileExistsError(
                f"a key pair named {name!r} exists in {root}; replace it with `sparkbus keys generate --force` (overwrite=True)"
            )
    public_dir.mkdir(parents=True, exist_ok=True)
    private_dir.mkdir(parents=True, exist_ok=True)
    private_dir.chmod(0o700)
    written: list[Path] = []
    for name in names:
        # create_certificates writes both files into one folder; the secret one is moved to private/.
        pub, sec = (Path(p) for p in zmq.auth.create_certificates(private_dir, name))
        sec.chmod(0o600)
        pub.replace(public_dir / pub.name)
        written += [public_dir / pub.name, sec]
    return written


def apply_server(sock: zmq.Socket[bytes], keys: KeyPair, domain: str) -> None:
    """Make ``sock`` (ROUTER or PULL, before bind) a CURVE server authenticated in ``domain``."""
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True


def apply_client(sock: zmq.Socket[bytes], keys: KeyPair, server_public: bytes) -> None:
    """Make ``sock`` (DEALER or PUSH, before connect) a CURVE client of the server holding ``server_public``."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = server_public


def key_names(key_dir: str | os.PathLike[str]) -> dict[bytes, str]:
    """Z85 public key -> name (``public/<name>.key``) of every public certificate in ``key_dir``."""
    names: dict[bytes, str] = {}
    for path in sorted((Path(key_dir) / PUBLIC).glob("*.key")):
        try:
            public, _ = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:  # pyzmq's own loader skips nothing: say which file
            raise MissingKey(f"cannot read the public certificate {path}: {exc}") from exc
        names[public] = path.stem
    return names


def key_owner(rid: bytes, user_id: str, owned: frozenset[bytes]) -> bool:
    """Whether a connection whose key is named ``user_id`` may speak as routing id ``rid``.

    ``owned``: the node ids (as routing ids) with a public key of their own in the directory. Any admitted
    key may speak for the others (they use the shared pair, or are clients with generated routing ids).
    """
    return rid not in owned or user_id.encode() == rid


def user_id(frame: zmq.Frame) -> str:
    """The name the ZAP handler gave the connection ``frame`` came on (its CURVE key's file)."""
    try:
        return str(frame.get("User-Id"))
    except zmq.ZMQError:  # no ZAP handler named it: a name that owns no node id
        return "?"


class _Authenticator(ThreadAuthenticator):
    """pyzmq's ZAP handler with an address allow-list and a refusal callback per domain, naming each
    admitted CURVE connection by its key's file (``User-Id``)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        super().__init__(ctx, log=logging.getLogger("sparkbus.bus.zap"))
        self.addresses: dict[str, frozenset[str]] = {}
        self.listeners: dict[str, Refused] = {}
        self.names: dict[str, dict[bytes, str]] = {}
        self._current: tuple[str, str] = ("", "")

    def curve_user_id(self, client_public_key: bytes) -> str:
        # Must not raise: an exception here ends the handler's thread, and with it every CURVE handshake.
        try:
            public = z85.encode(client_public_key)
            return self.names.get(self._current[0], {}).get(public) or public.decode("ascii")
        except Exception:
            log.exception("naming a CURVE key failed")
            return "?"

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) >= 6:
            domain = msg[2].decode("utf-8", "replace")
            address = msg[3].decode("utf-8", "replace")
            self._current = (domain, address)
            allowed = self.addresses.get(domain)
            if allowed and address not in allowed:
                self._send_zap_reply(msg[1], b"400", b"Address not allowed")
                return
        await super().handle_zap_message(msg)

    def _send_zap_reply(
        self, request_id: bytes, status_code: bytes, status_text: bytes, user_id: str = "anonymous"
    ) -> None:
        super()._send_zap_reply(request_id, status_code, status_text, user_id)
        if status_code != b"200":
            domain, address = self._current
            listener = self.listeners.get(domain)
            if listener is not None:
                try:
                    listener(address, status_text.decode("utf-8", "replace"))
                except Exception:  # a counter must never take the handler down
                    log.exception("ZAP refusal listener for %s failed", domain)


_AUTH: dict[int, tuple[int, _Authenticator]] = {}
_AUTH_LOCK = threading.Lock()


def register(
    ctx: zmq.Context[zmq.Socket[bytes]], domain: str, settings: CurveSettings, on_refused: Refused
) -> dict[bytes, str]:
    """Admit, in ``domain``, clients whose public key is in the key directory (and whose address is allowed).

    Starts the context's ZAP handler if it has none yet. Returns the admitted keys' names (``key_names``).
    """
    with _AUTH_LOCK:
        entry = _AUTH.get(id(ctx))
        if entry is None or entry[0] != os.getpid():
            auth = _Authenticator(ctx)
            auth.start()
            entry = (os.getpid(), auth)
            _AUTH[id(ctx)] = entry
        auth = entry[1]
        auth.configure_curve(domain=domain, location=str(Path(settings.key_dir) / PUBLIC))
        names = auth.names[domain] = key_names(settings.key_dir)
        auth.addresses[domain] = frozenset(settings.allow_addresses)
        auth.listeners[domain] = on_refused
    return names


def unregister(ctx: zmq.Context[zmq.Socket[bytes]], domain: str) -> None:
    """Forget ``domain``: from now on it admits nobody."""
    with _AUTH_LOCK:
        entry = _AUTH.get(id(ctx))
        if entry is None or entry[0] != os.getpid():
            return
        auth = entry[1]
        auth.certs.pop(domain, None)
        auth.names.pop(domain, None)
        auth.addresses.pop(domain, None)
        auth.listeners.pop(domain, None)
