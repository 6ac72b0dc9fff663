// The AWS SDK for JavaScript v3 against a live jobq (tests/test_sqs_js.py): send, receive, change visibility,
// delete, and their batches. The endpoint, queue name and credentials come from the environment; the SDK
// signs every request with SigV4 and checks the MD5 digests of what it sends and receives.
import assert from "node:assert/strict";
import {
  ChangeMessageVisibilityBatchCommand,
  ChangeMessageVisibilityCommand,
  CreateQueueCommand,
  DeleteMessageBatchCommand,
  DeleteMessageCommand,
  GetQueueAttributesCommand,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  SendMessageCommand,
  SQSClient,
} from "@aws-sdk/client-sqs";

const sqs = new SQSClient({
  endpoint: process.env.JOBQ_URL,
  region: "eu-west-1",
  maxAttempts: 1,
  credentials: { accessKeyId: process.env.AWS_ACCESS_KEY_ID, secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY },
});

const { QueueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: process.env.QUEUE }));
assert.ok(QueueUrl.endsWith(`/${process.env.QUEUE}`), QueueUrl);

// Until `count` messages arrived (a receive may hand out fewer than are ready) or the deadline passed.
async function receive(count, extra = {}) {
  const got = [];
  const deadline = Date.now() + 20_000;
  while (got.length < count && Date.now() < deadline) {
    const { Messages = [] } = await sqs.send(
      new ReceiveMessageCommand({
        QueueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: ["All"],
        MessageSystemAttributeNames: ["ApproximateReceiveCount", "SentTimestamp"], ...extra,
      }),
    );
    got.push(...Messages);
  }
  return got;
}

const body = "héllo, wörld ✓ <&>";
const one = await sqs.send(
  new SendMessageCommand({
    QueueUrl, MessageBody: body,
    MessageAttributes: { kind: { DataType: "String", StringValue: "greeting" }, n: { DataType: "Number", StringValue: "42" } },
  }),
);
assert.ok(one.MessageId && one.MD5OfMessageBody && one.MD5OfMessageAttributes);

const batch = await sqs.send(
  new SendMessageBatchCommand({
    QueueUrl,
    Entries: [1, 2, 3].map((i) => ({ Id: `m${i}`, MessageBody: `batch ${i}` })),
  }),
);
assert.equal(batch.Successful.length, 3);
assert.deepEqual(batch.Failed ?? [], []);

const first = await receive(4, { VisibilityTimeout: 30 });
assert.equal(first.length, 4);
const greeting = first.find((m) => m.MessageId === one.MessageId);
assert.equal(greeting.Body, body);
assert.equal(greeting.MessageAttributes.n.StringValue, "42");
assert.equal(greeting.Attributes.ApproximateReceiveCount, "1");
assert.deepEqual(new Set(first.map((m) => m.Body)), new Set([body, "batch 1", "batch 2", "batch 3"]));

// Visibility 0 puts a message back at once: received again, whole. (Its ApproximateReceiveCount is jobq's
// attempts, which a release does not count.)
await sqs.send(new ChangeMessageVisibilityCommand({ QueueUrl, ReceiptHandle: greeting.ReceiptHandle, VisibilityTimeout: 0 }));
const [again] = await receive(1);
assert.equal(again.MessageId, one.MessageId);
assert.equal(again.Body, body);
assert.notEqual(again.ReceiptHandle, greeting.ReceiptHandle);

const others = first.filter((m) => m.MessageId !== one.MessageId);
const changed = await sqs.send(
  new ChangeMessageVisibilityBatchCommand({
    QueueUrl,
    Entries: [
      ...others.slice(0, 2).map((m, i) => ({ Id: `c${i}`, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0 })),
      { Id: "stale", ReceiptHandle: greeting.ReceiptHandle, VisibilityTimeout: 0 }, // handed out before the last receive
    ],
  }),
);
assert.deepEqual(changed.Successful.map((e) => e.Id).sort(), ["c0", "c1"]);
assert.deepEqual(changed.Failed.map((e) => e.Id), ["stale"]);
const back = await receive(2);
assert.deepEqual(new Set(back.map((m) => m.MessageId)), new Set(others.slice(0, 2).map((m) => m.MessageId)));

await sqs.send(new DeleteMessageCommand({ QueueUrl, ReceiptHandle: again.ReceiptHandle }));
const deleted = await sqs.send(
  new DeleteMessageBatchCommand({
    QueueUrl,
    Entries: [...back, others[2]].map((m, i) => ({ Id: `d${i}`, ReceiptHandle: m.ReceiptHandle })),
  }),
);
assert.equal(deleted.Successful.length, 3);
assert.deepEqual(deleted.Failed ?? [], []);

const { Messages: none = [] } = await sqs.send(new ReceiveMessageCommand({ QueueUrl, WaitTimeSeconds: 0 }));
assert.equal(none.length, 0);
const { Attributes } = await sqs.send(
  new GetQueueAttributesCommand({ QueueUrl, AttributeNames: ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"] }),
);
assert.equal(Attributes.ApproximateNumberOfMessages, "0");
assert.equal(Attributes.ApproximateNumberOfMessagesNotVisible, "0");
console.log(JSON.stringify({ ok: true, sent: 4, received: first.length + 1 + back.length }));
