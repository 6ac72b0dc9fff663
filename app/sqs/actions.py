"""The SQS actions by name: the table the endpoint dispatches on (app/sqs/endpoint.py). Each takes the request's
parameters in the JSON protocol's shape (app/sqs/wire.py reads the query protocol into it) and returns its
result in that shape; docs/sqs.md says, action by action, what jobq does and where it differs from SQS."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.sqs.messages import (
    change_message_visibility,
    change_message_visibility_batch,
    delete_message,
    delete_message_batch,
    receive_message,
    send_message,
    send_message_batch,
)
from app.sqs.params import Call, Params, Result
from app.sqs.queues import (
    cancel_message_move_task,
    create_queue,
    delete_queue,
    get_queue_attributes,
    get_queue_url,
    list_dead_letter_source_queues,
    list_message_move_tasks,
    list_queue_tags,
    list_queues,
    purge_queue,
    set_queue_attributes,
    start_message_move_task,
    tag_queue,
    unsupported,
    untag_queue,
)

__all__ = ["ACTIONS", "Call"]


Handler = Callable[[Call, Params], Awaitable[Result]]

ACTIONS: dict[str, Handler] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
    "AddPermission": unsupported,
    "RemovePermission": unsupported,
}
