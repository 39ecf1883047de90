from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class TensorProto(_message.Message):
    __slots__ = ("token", "generation", "tensor_id", "seq", "dtype", "shape", "tensor_content", "dynamic")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TENSOR_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_CONTENT_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    generation: int
    tensor_id: int
    seq: int
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    tensor_content: bytes
    dynamic: bool
    def __init__(self, token: _Optional[bytes] = ..., generation: _Optional[int] = ..., tensor_id: _Optional[int] = ..., seq: _Optional[int] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., tensor_content: _Optional[bytes] = ..., dynamic: _Optional[bool] = ...) -> None: ...

class WriteReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenRequest(_message.Message):
    __slots__ = ("token", "generation")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    generation: int
    def __init__(self, token: _Optional[bytes] = ..., generation: _Optional[int] = ...) -> None: ...

class OpenReply(_message.Message):
    __slots__ = ("generation",)
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    generation: int
    def __init__(self, generation: _Optional[int] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: bytes
    def __init__(self, token: _Optional[bytes] = ...) -> None: ...

class CloseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
