"""SQS's errors, as both protocols render them: a JSON `__type` and the query protocol's code.

SqsError (JSON __type: com.amazonaws.sqs#<class name>)  HTTP  query code
 +-- InvalidAction                 400  InvalidAction
 +-- MissingParameter              400  MissingParameter
 +-- InvalidParameterValue         400  InvalidParameterValue
 +-- InvalidAttributeName          400  InvalidAttributeName
 +-- InvalidAttributeValue         400  InvalidAttributeValue
 +-- InvalidMessageContents        400  InvalidMessageContents
 +-- QueueDoesNotExist             400  AWS.SimpleQueueService.NonExistentQueue
 +-- QueueNameExists               400  QueueAlreadyExists
 +-- ReceiptHandleIsInvalid        400  ReceiptHandleIsInvalid
 +-- MessageNotInflight            400  AWS.SimpleQueueService.MessageNotInflight
 +-- EmptyBatchRequest             400  AWS.SimpleQueueService.EmptyBatchRequest
 +-- TooManyEntriesInBatchRequest  400  AWS.SimpleQueueService.TooManyEntriesInBatchRequest
 +-- BatchEntryIdsNotDistinct      400  AWS.SimpleQueueService.BatchEntryIdsNotDistinct
 +-- InvalidBatchEntryId           400  AWS.SimpleQueueService.InvalidBatchEntryId
 +-- BatchRequestTooLong           400  AWS.SimpleQueueService.BatchRequestTooLong
 +-- UnsupportedOperation          400  AWS.SimpleQueueService.UnsupportedOperation
 +-- ResourceNotFoundException     400  ResourceNotFoundException
 +-- MissingAuthenticationToken    403  MissingAuthenticationToken
 +-- InvalidClientTokenId          403  InvalidClientTokenId
 +-- AccessDenied                  403  AccessDenied
 +-- RequestThrottled              400  RequestThrottled
 +-- ServiceUnavailable            503  ServiceUnavailable  (server fault)
 +-- InternalFailure               500  InternalFailure     (server fault)
 +-- Refused                       any  its own code        an authenticator's refusal (SignatureDoesNotMatch, ...)

botocore reads the query code from the `x-amzn-query-error: <code>;<Sender|Receiver>` header of a JSON
answer (the service model is `awsQueryCompatible`) and the JSON type names the exception class, so both
`client.exceptions.QueueDoesNotExist` and `Error.Code == "AWS.SimpleQueueService.NonExistentQueue"` hold.
"""

from __future__ import annotations

from typing import ClassVar


class SqsError(Exception):
    status: ClassVar[int] = 400
    query_code: ClassVar[str | None] = None  # None: the class name
    sender: ClassVar[bool] = True  # the caller's fault (Sender) or the service's (Receiver)

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)

    @property
    def code(self) -> str:
        return type(self).__name__

    @property
    def http_status(self) -> int:
        return self.status

    @property
    def query(self) -> str:
        return self.query_code or self.code


class InvalidAction(SqsError):
    pass


class MissingParameter(SqsError):
    pass


class InvalidParameterValue(SqsError):
    pass


class InvalidAttributeName(SqsError):
    pass


class InvalidAttributeValue(SqsError):
    pass


class InvalidMessageContents(SqsError):
    pass


class QueueDoesNotExist(SqsError):
    query_code = "AWS.SimpleQueueService.NonExistentQueue"


class QueueNameExists(SqsError):
    query_code = "QueueAlreadyExists"


class ReceiptHandleIsInvalid(SqsError):
    pass


class MessageNotInflight(SqsError):
    query_code = "AWS.SimpleQueueService.MessageNotInflight"


class EmptyBatchRequest(SqsError):
    query_code = "AWS.SimpleQueueService.EmptyBatchRequest"


class TooManyEntriesInBatchRequest(SqsError):
    query_code = "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"


class BatchEntryIdsNotDistinct(SqsError):
    query_code = "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"


class InvalidBatchEntryId(SqsError):
    query_code = "AWS.SimpleQueueService.InvalidBatchEntryId"


class BatchRequestTooLong(SqsError):
    query_code = "AWS.SimpleQueueService.BatchRequestTooLong"


class UnsupportedOperation(SqsError):
    query_code = "AWS.SimpleQueueService.UnsupportedOperation"


class ResourceNotFoundException(SqsError):
    pass


class MissingAuthenticationToken(SqsError):
    status = 403


class InvalidClientTokenId(SqsError):
    status = 403


class AccessDenied(SqsError):
    status = 403


class RequestThrottled(SqsError):
    pass


class ServiceUnavailable(SqsError):
    status = 503
    sender = False


class InternalFailure(SqsError):
    status = 500
    sender = False


class Refused(SqsError):
    """A refusal named by its code and status rather than by a class: what an SqsAuthenticator raises
    (SignatureDoesNotMatch, RequestExpired, IncompleteSignature, ...), rendered like every SQS error."""

    def __init__(self, code: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self._code = code
        self._status = status

    @property
    def code(self) -> str:
        return self._code

    @property
    def http_status(self) -> int:
        return self._status

    @property
    def query(self) -> str:
        return self._code
