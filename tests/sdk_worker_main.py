"""A jobq_client Worker as a real process, for the signal tests: every handler start and end is
appended to a log file, one line each ("start <id>", "done <id>").

usage: python tests/sdk_worker_main.py URL QUEUE LOG [--work SECONDS | --block] [--concurrency N] [--grace S]
                                      [--lease S]
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from jobq_client import JobContext, Worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("log")
    parser.add_argument("--work", type=float, default=0.2, help="seconds each job takes")
    parser.add_argument("--block", action="store_true", help="handlers never return")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--lease", type=int, default=30, help="lease_seconds of each claim")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(line: str) -> None:
        os.write(fd, f"{line}\n".encode())  # one write per line: lines from threads never interleave

    worker = Worker(
        args.url, concurrency=args.concurrency, shutdown_grace=args.grace, wait_seconds=5, lease_seconds=args.lease
    )

    @worker.handler(args.queue)
    def work(job: JobContext) -> dict[str, int]:
        note(f"start {job.id}")
        while args.block:  # deaf to JobContext.stopped on purpose: a handler that will not stop
            time.sleep(3600)
        time.sleep(args.work)
        note(f"done {job.id}")
        return {"n": job.payload}

    worker.run()
    note("exit")


if __name__ == "__main__":
    main()
