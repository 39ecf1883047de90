"""The wire format, sans-IO: pure encode/decode functions, no sockets.

Two families of messages:

* **Control messages** (the control plane: hello, auth, lookup, claim (one tensor or many),
  attach, heartbeat, goodbye) are frozen, slotted dataclasses encoded as msgpack maps
  ``{"v": version, "t": type, ...fields}``.
* **Data frames** (the TCP data plane) are fixed little-endian structs: a hello carrying the
  connection token, a header per tensor write, and a credit frame flowing back. A header is
  followed by exactly ``nbytes`` of raw payload, which never passes through this module. The
  ``nixl`` transport sends the same headers and credits as NIXL notifications (a header there
  follows a message counter and its payload has already landed by RDMA).

Whatever bytes arrive, decoding either returns a well-typed message or raises
:class:`~tensorwire.errors.LocalProtocolError`; nothing else escapes.
"""

from __future__ import annotations

import dataclasses
import gc
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

from .errors import LocalProtocolError
from .spec import MAX_DYNAMIC_NDIM

VERSION = 1

# --------------------------------------------------------------------------------------------
# Control messages
# --------------------------------------------------------------------------------------------

_FIELD_TYPES: dict[str, type] = {
    "int": int,
    "str": str,
    "bytes": bytes,
    "bool": bool,
    "list[Any]": list,
    "dict[str, Any]": dict,
}


@dataclass(frozen=True, slots=True)
class Message:
    """Base of control messages. ``TYPE`` is the tag on the wire."""

    TYPE: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """Sender -> receiver: who I am, and a nonce for the receiver to answer in its proof."""

    TYPE: ClassVar[str] = "hello"
    client: str
    pid: int
    host: str
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Challenge(Message):
    """Receiver -> sender: prove you know the shared secret (HMAC over both nonces)."""

    TYPE: ClassVar[str] = "challenge"
    nonce: bytes


@dataclass(frozen=True, slots=True)
class Auth(Message):
    TYPE: ClassVar[str] = "auth"
    mac: bytes


@dataclass(frozen=True, slots=True)
class Welcome(Message):
    """Receiver -> sender: the session is open. ``token`` admits the sender to the data plane."""

    TYPE: ClassVar[str] = "welcome"
    generation: int
    pid: int
    host: str
    proof: bytes
    token: bytes
    transports: dict[str, Any]
    # How long the receiver waits for a silent session before it drops it, in milliseconds (0:
    # never): the sender heartbeats often enough for it whatever its own interval. Added after
    # the first release, so a welcome without it decodes as 0 (the sender's own interval).
    heartbeat_timeout_ms: int = 0
    # What the receiver's owner publishes about it (Receiver(info=...)): a program's own facts
    # for its senders to read (Sender.receiver_info). Added later: a welcome without it is {}.
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Lookup(Message):
    """Sender -> receiver: the address book, please. ``compact``: the sender reads the compact
    ring layouts (layout.RingLayout.to_wire), a fifth of the bytes; a receiver that predates the
    field ignores it and sends every slot's offsets, which such a sender reads too."""

    TYPE: ClassVar[str] = "lookup"
    generation: int
    compact: bool = False


@dataclass(frozen=True, slots=True)
class AddressBook(Message):
    """Every registered tensor's remote address: regions ``[[name, size], ...]`` and tensors
    ``[[tensor_id, spec, layout], ...]``."""

    TYPE: ClassVar[str] = "addresses"
    generation: int
    regions: list[Any]
    tensors: list[Any]


@dataclass(frozen=True, slots=True)
class Claim(Message):
    """Sender -> receiver: I will be the one writer of this tensor, over this transport."""

    TYPE: ClassVar[str] = "claim"
    generation: int
    tensor_id: int
    transport: str
    #: the sender reads where a moved ring lies from the answer (``Claimed.layout``): a sender
    #: older than moves would write into the ring the tensor left, which nobody reads, so its
    #: claim of a moved tensor is refused instead
    placed: bool = False


@dataclass(frozen=True, slots=True)
class Claimed(Message):
    """Where the ring stands: the next sequence number to write, the credits returned, and the
    message each slot holds (the writer picks a free slot itself)."""

    TYPE: ClassVar[str] = "claimed"
    generation: int
    tensor_id: int
    next_seq: int
    released: int
    slots: list[Any]
    #: this claim's epoch: a shared-memory writer may write only while the ring's owner word
    #: holds it (the receiver changes the word when it drops the writer)
    epoch: int
    #: where the ring lies now (RingLayout.to_wire), once the receiver has moved it away from
    #: a dropped writer; empty while it is where the address book first placed it
    layout: list[Any] = dataclasses.field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ClaimMany(Message):
    """Sender -> receiver: :class:`Claim` for each of ``tensor_ids`` (at most
    :data:`MAX_CLAIMS`), in one round trip: a batch's first writes (a model's parameters) made
    their claims one after another, a round trip each. Each is granted or refused on its own,
    exactly as its own Claim would be."""

    TYPE: ClassVar[str] = "claim-many"
    generation: int
    tensor_ids: list[Any]
    transport: str
    placed: bool = False  # as Claim's


@dataclass(frozen=True, slots=True)
class ClaimedMany(Message):
    """The answer to :class:`ClaimMany`, one item per tensor in its order: a granted claim as
    ``[tensor_id, next_seq, released, slots, epoch]`` (:class:`Claimed`'s fields; with its
    ``layout`` sixth where the ring has moved), a refused one as ``[tensor_id, code, message]``
    (:class:`ErrorReply`'s)."""

    TYPE: ClassVar[str] = "claimed-many"
    generation: int
    claims: list[Any]


#: The most tensors one :class:`ClaimMany` names (a sender sends more in several)
MAX_CLAIMS = 1024


@dataclass(frozen=True, slots=True)
class Attach(Message):
    """Sender -> receiver: join a transport whose peers must know each other (``nixl``: the
    sender's agent metadata). Sent again, it asks for the receiver's current details."""

    TYPE: ClassVar[str] = "attach"
    generation: int
    transport: str
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Attached(Message):
    """Receiver -> sender: what the transport needs to reach the receiver's registered memory
    (``nixl``: the receiver's agent metadata and every region's base address)."""

    TYPE: ClassVar[str] = "attached"
    generation: int
    details: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    """Sender -> receiver, on a socket of its own: ``token`` names the session that is alive."""

    TYPE: ClassVar[str] = "heartbeat"
    generation: int
    token: bytes


@dataclass(frozen=True, slots=True)
class Resume(Message):
    """Sender -> receiver, first on a control connection opened anew (its request before went
    unanswered, and that connection was closed so that a late reply cannot pass for the next
    request's): the session ``token`` names goes on over this connection. Answered with Ack."""

    TYPE: ClassVar[str] = "resume"
    generation: int
    token: bytes


@dataclass(frozen=True, slots=True)
class Goodbye(Message):
    TYPE: ClassVar[str] = "goodbye"
    generation: int


@dataclass(frozen=True, slots=True)
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    generation: int


@dataclass(frozen=True, slots=True)
class ErrorReply(Message):
    """The request was refused. ``code`` is one of :data:`ERROR_CODES`."""

    TYPE: ClassVar[str] = "error"
    code: str
    message: str


ERROR_CODES = frozenset(
    {
        "auth",
        "stale-generation",
        "unknown-tensor",
        "busy",
        "silent-owner",  # its writer, on another host, is silent (dead?): claim again later
        "fenced",  # the tensor's dropped writer may still be storing into it: claim again later
        "protocol",
        "closed",
        "unauthenticated",
    }
)

MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        Hello,
        Challenge,
        Auth,
        Welcome,
        Lookup,
        AddressBook,
        Claim,
        Claimed,
        ClaimMany,
        ClaimedMany,
        Attach,
        Attached,
        Heartbeat,
        Resume,
        Goodbye,
        Ack,
        ErrorReply,
    )
}


def _default(f: dataclasses.Field[Any]) -> Any:
    """A field's default: a value, a factory (called for each message that lacks the field:
    a mutable default is never shared), or None where the field is required."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    return None


# (name, type, default): a field with a default was added to its message later, and a peer that
# predates it sends none; every other field must be present.
_FIELDS: dict[type[Message], list[tuple[str, type, Any]]] = {
    cls: [(f.name, _FIELD_TYPES[str(f.type)], _default(f)) for f in dataclasses.fields(cls)]
    for cls in MESSAGE_TYPES.values()
}


def encode(msg: Message) -> bytes:
    body: dict[str, Any] = {"v": VERSION, "t": msg.TYPE}
    for name, _, _ in _FIELDS[type(msg)]:
        body[name] = getattr(msg, name)
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


#: Bytes from which a message is unpacked with the garbage collector paused (an address book of
#: thousands of tensors: its millions of small objects set off collections that scan every
#: object of the process, again and again; as msgpack's own documentation advises)
LARGE_MESSAGE = 1 << 20


def decode(data: bytes) -> Message:
    """Decode one control message; anything malformed raises :class:`LocalProtocolError`."""
    paused = len(data) >= LARGE_MESSAGE and gc.isenabled()
    if paused:
        gc.disable()
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises many types for garbage; normalise them
        raise LocalProtocolError(
            f"undecodable control message ({len(data)} bytes): {exc}"
        ) from None
    finally:
        if paused:
            gc.enable()
    if not isinstance(body, dict):
        raise LocalProtocolError(f"control message is not a map: {type(body).__name__}")
    version = body.get("v")
    if version != VERSION:
        raise LocalProtocolError(
            f"unsupported control protocol version {version!r} (want {VERSION})"
        )
    tag = body.get("t")
    cls = MESSAGE_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise LocalProtocolError(f"unknown control message type {tag!r:.80}")
    kwargs = {}
    for name, typ, default in _FIELDS[cls]:
        value = body[name] if name in body else default() if callable(default) else default
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            raise LocalProtocolError(
                f"{cls.TYPE} message: field {name!r} must be {typ.__name__}, got {value!r:.80}"
            )
        kwargs[name] = value
    return cls(**kwargs)


# --------------------------------------------------------------------------------------------
# Data frames (TCP data plane)
# --------------------------------------------------------------------------------------------

DATA_HELLO_MAGIC = b"TWDH"
DATA_MAGIC = b"TWDF"
CREDIT_MAGIC = b"TWCR"
TOKEN_BYTES = 32
FLAG_DYNAMIC = 0x01
FLAG_BYE = 0x02  # the sender's last frame: no payload; everything before it has been sent

DATA_HELLO = struct.Struct("<4sB3xQ32s")  # magic, version, generation, token
DATA_HEADER = struct.Struct("<4sBBHIIQQQ")  # magic, version, flags, ndim, tensor, slot, gen, seq, n
CREDIT = struct.Struct("<4sB3xIQ")  # magic, version, tensor, released
DIM = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class DataHello:
    generation: int
    token: bytes


@dataclass(frozen=True, slots=True)
class DataHeader:
    tensor_id: int
    slot: int
    generation: int
    seq: int
    nbytes: int
    shape: tuple[int, ...] | None = None  # only for dynamic tensors
    bye: bool = False  # the goodbye frame (all other fields zero)


@dataclass(frozen=True, slots=True)
class Credit:
    tensor_id: int
    released: int


def encode_data_hello(generation: int, token: bytes) -> bytes:
    return DATA_HELLO.pack(DATA_HELLO_MAGIC, VERSION, generation, token)


def decode_data_hello(data: bytes | bytearray | memoryview) -> DataHello:
    if len(data) != DATA_HELLO.size:
        raise LocalProtocolError(f"data hello must be {DATA_HELLO.size} bytes, got {len(data)}")
    magic, version, generation, token = DATA_HELLO.unpack(data)
    _check_magic(magic, version, DATA_HELLO_MAGIC, "data hello")
    return DataHello(generation, token)


def pack_data_header(out: bytearray | memoryview, header: DataHeader) -> int:
    """Write ``header`` into the preallocated ``out``; return the number of bytes used."""
    flags = FLAG_BYE if header.bye else 0
    ndim = 0
    if header.shape is not None:
        flags |= FLAG_DYNAMIC
        ndim = len(header.shape)
    DATA_HEADER.pack_into(
        out,
        0,
        DATA_MAGIC,
        VERSION,
        flags,
        ndim,
        header.tensor_id,
        header.slot,
        header.generation,
        header.seq,
        header.nbytes,
    )
    for k in range(ndim):
        DIM.pack_into(out, DATA_HEADER.size + 8 * k, header.shape[k])  # type: ignore[index]
    return DATA_HEADER.size + 8 * ndim


def pack_static_data_header(
    out: bytearray | memoryview, tensor_id: int, slot: int, generation: int, seq: int, nbytes: int
) -> int:
    """:func:`pack_data_header` of a static tensor's header, from its fields: each ``tcp`` write
    on a sender's fast route, without building a DataHeader."""
    DATA_HEADER.pack_into(
        out, 0, DATA_MAGIC, VERSION, 0, 0, tensor_id, slot, generation, seq, nbytes
    )
    return DATA_HEADER.size


def encode_data_header(header: DataHeader) -> bytes:
    out = bytearray(DATA_HEADER.size + 8 * MAX_DYNAMIC_NDIM)
    return bytes(out[: pack_data_header(out, header)])


MAX_HEADER_BYTES = DATA_HEADER.size + 8 * MAX_DYNAMIC_NDIM


def peek_static_header(data: memoryview, offset: int) -> tuple[int, int, int, int, int] | None:
    """The fields (tensor, slot, generation, seq, nbytes) of the data header at ``offset`` in
    ``data`` (at least DATA_HEADER.size bytes from there), if it is a static tensor's well-formed
    header, the common frame; None for any other (a goodbye, a dynamic shape, anything
    malformed), which :class:`HeaderReader` then decodes, or refuses with its errors."""
    magic, version, flags, ndim, tid, slot, gen, seq, nbytes = DATA_HEADER.unpack_from(data, offset)
    if flags or ndim or magic != DATA_MAGIC or version != VERSION:
        return None
    return tid, slot, gen, seq, nbytes


class HeaderReader:
    """Incremental decoder of data headers, for a reader that owns the socket.

    ``need`` is how many more bytes the current header wants; pass them to :meth:`feed` (in any
    pieces, down to a byte at a time). :meth:`feed` returns the header once it is complete and then
    expects the next one. The payload that follows a header is not fed here: the caller reads it
    straight into the destination buffer.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._want = DATA_HEADER.size
        self._fixed: tuple[Any, ...] | None = None

    @property
    def need(self) -> int:
        return self._want - len(self._buf)

    @property
    def between_frames(self) -> bool:
        """Nothing of the next header has been fed yet."""
        return not self._buf

    def feed(self, data: bytes | bytearray | memoryview) -> DataHeader | None:
        if len(data) > self.need:
            raise LocalProtocolError(
                f"fed {len(data)} bytes to a header that needs {self.need}: framing lost"
            )
        self._buf += data
        if self.need:
            return None
        if self._fixed is None:
            magic, version, flags, ndim, tid, slot, gen, seq, nbytes = DATA_HEADER.unpack(self._buf)
            _check_magic(magic, version, DATA_MAGIC, "data header")
            if flags & ~(FLAG_DYNAMIC | FLAG_BYE):
                raise LocalProtocolError(f"data header has unknown flags 0x{flags:02x}")
            dynamic = bool(flags & FLAG_DYNAMIC)
            bye = bool(flags & FLAG_BYE)
            if ndim > MAX_DYNAMIC_NDIM or (ndim and not dynamic):
                raise LocalProtocolError(f"data header has an invalid rank {ndim}")
            if bye and (dynamic or nbytes):
                raise LocalProtocolError("goodbye frame with a payload")
            self._fixed = (tid, slot, gen, seq, nbytes, dynamic, ndim, bye)
            if dynamic:
                self._want += 8 * ndim
                if self.need:
                    return None
        tid, slot, gen, seq, nbytes, dynamic, ndim, bye = self._fixed
        shape = None
        if dynamic:
            base = DATA_HEADER.size
            shape = tuple(DIM.unpack_from(self._buf, base + 8 * k)[0] for k in range(ndim))
        self._buf.clear()
        self._want = DATA_HEADER.size
        self._fixed = None
        return DataHeader(tid, slot, gen, seq, nbytes, shape, bye)


NOTIFICATION_COUNTER = struct.Struct("<Q")


#: Most data headers one NIXL notification carries (a batch sends its headers together).
MAX_NOTIFICATION_HEADERS = 32
#: The common notification, packed and unpacked in one call: one header of a static tensor.
_ONE_STATIC = struct.Struct("<Q" + DATA_HEADER.format.removeprefix("<"))


def encode_notification(counter: int, *headers: DataHeader) -> bytes:
    """Data headers sent as one NIXL notification, behind the channel's message counter (which
    lets the receiver put notifications back in order: UCX does not promise it across lanes).
    One header for a write; up to MAX_NOTIFICATION_HEADERS for a batch, completed in order."""
    if len(headers) == 1 and headers[0].shape is None:  # a write's (NIXL's per-message path)
        h = headers[0]
        flags = FLAG_BYE if h.bye else 0
        return _ONE_STATIC.pack(
            counter,
            DATA_MAGIC,
            VERSION,
            flags,
            0,
            h.tensor_id,
            h.slot,
            h.generation,
            h.seq,
            h.nbytes,
        )
    if not 0 < len(headers) <= MAX_NOTIFICATION_HEADERS:
        raise ValueError(f"a notification carries 1 to {MAX_NOTIFICATION_HEADERS} headers")
    out = bytearray(NOTIFICATION_COUNTER.size + MAX_HEADER_BYTES * len(headers))
    NOTIFICATION_COUNTER.pack_into(out, 0, counter)
    used = NOTIFICATION_COUNTER.size
    for header in headers:
        used += pack_data_header(memoryview(out)[used:], header)
    return bytes(out[:used])


def encode_static_notification(
    counter: int, tensor_id: int, slot: int, generation: int, seq: int, nbytes: int
) -> bytes:
    """:func:`encode_notification` of one static tensor's header, from its fields: the notification
    of each ``nixl`` write on a sender's fast route, without building a DataHeader."""
    return _ONE_STATIC.pack(
        counter, DATA_MAGIC, VERSION, 0, 0, tensor_id, slot, generation, seq, nbytes
    )


def peek_static_notification(
    data: bytes | bytearray | memoryview,
) -> tuple[int, int, int, int, int, int] | None:
    """The counter and header fields (tensor, slot, generation, seq, nbytes) of a notification
    of one static tensor's well-formed header, each ``nixl`` write's; None for any other, which
    :func:`decode_notification` then reads, or refuses with its errors."""
    if len(data) != _ONE_STATIC.size:
        return None
    counter, magic, version, flags, ndim, tid, slot, gen, seq, nbytes = _ONE_STATIC.unpack(data)
    if flags or ndim or magic != DATA_MAGIC or version != VERSION:
        return None
    return counter, tid, slot, gen, seq, nbytes


def decode_notification(data: bytes | bytearray | memoryview) -> tuple[int, list[DataHeader]]:
    """The counter and the headers of one notification: one to MAX_NOTIFICATION_HEADERS,
    nothing after the last; a goodbye only alone."""
    if len(data) == _ONE_STATIC.size:  # one header of a static tensor, the common case
        counter, magic, version, flags, ndim, tid, slot, gen, seq, nbytes = _ONE_STATIC.unpack(data)
        # what HeaderReader would accept; anything else goes its way, for its errors
        if magic == DATA_MAGIC and version == VERSION and not ndim:
            if not flags:
                return counter, [DataHeader(tid, slot, gen, seq, nbytes, None)]
            if flags == FLAG_BYE and not nbytes:
                return counter, [DataHeader(tid, slot, gen, seq, 0, None, True)]
    if len(data) < NOTIFICATION_COUNTER.size + DATA_HEADER.size:
        raise LocalProtocolError(f"notification too short: {len(data)} bytes")
    (counter,) = NOTIFICATION_COUNTER.unpack_from(data, 0)
    reader = HeaderReader()
    rest = memoryview(data)[NOTIFICATION_COUNTER.size :]
    headers: list[DataHeader] = []
    while len(rest):
        if len(headers) == MAX_NOTIFICATION_HEADERS:
            raise LocalProtocolError(
                f"notification has bytes after its {MAX_NOTIFICATION_HEADERS} headers"
            )
        header = None
        while header is None:
            need = reader.need
            if len(rest) < need:
                raise LocalProtocolError("notification ends inside a header")
            header = reader.feed(rest[:need])
            rest = rest[need:]
        headers.append(header)
    if len(headers) > 1 and any(h.bye for h in headers):
        raise LocalProtocolError("a goodbye shares a notification with other headers")
    return counter, headers


def encode_credit(tensor_id: int, released: int) -> bytes:
    return CREDIT.pack(CREDIT_MAGIC, VERSION, tensor_id, released)


def decode_credit(data: bytes | bytearray | memoryview) -> Credit:
    if len(data) != CREDIT.size:
        raise LocalProtocolError(f"credit frame must be {CREDIT.size} bytes, got {len(data)}")
    magic, version, tid, released = CREDIT.unpack(data)
    _check_magic(magic, version, CREDIT_MAGIC, "credit frame")
    return Credit(tid, released)


def _check_magic(magic: bytes, version: int, want: bytes, what: str) -> None:
    if magic != want:
        raise LocalProtocolError(f"{what}: bad magic {magic!r} (want {want!r})")
    if version != VERSION:
        raise LocalProtocolError(f"{what}: unsupported version {version} (want {VERSION})")
