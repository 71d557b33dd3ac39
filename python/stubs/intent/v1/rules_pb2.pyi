from buf.validate import validate_pb2 as _validate_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
TENANT_FIELD_NUMBER: _ClassVar[int]
tenant: _descriptor.FieldDescriptor
KEY_FIELD_NUMBER: _ClassVar[int]
key: _descriptor.FieldDescriptor
SESSION_ID_FIELD_NUMBER: _ClassVar[int]
session_id: _descriptor.FieldDescriptor
ACTION_FIELD_NUMBER: _ClassVar[int]
action: _descriptor.FieldDescriptor
REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
request_id: _descriptor.FieldDescriptor
REASON_FIELD_NUMBER: _ClassVar[int]
reason: _descriptor.FieldDescriptor
ACTOR_FIELD_NUMBER: _ClassVar[int]
actor: _descriptor.FieldDescriptor
LABEL_FILTER_FIELD_NUMBER: _ClassVar[int]
label_filter: _descriptor.FieldDescriptor
OPERATION_FIELD_NUMBER: _ClassVar[int]
operation: _descriptor.FieldDescriptor
