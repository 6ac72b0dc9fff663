"""The SQS API at the service's root: both wire protocols, errors, digests and the actions (docs/sqs.md)."""
