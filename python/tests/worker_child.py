"""A worker process for the crash and pause scenarios.

    worker_child.py TARGET KEY PROVIDER_URL TTL

It runs one task whose execute places the order, prints "EFFECT <token>"
and then waits for a line on stdin before returning the result (the test
pauses or kills it there). It then prints "OUTCOME <name> superseded=<b>"
or "REFUSED <exception class>".
"""

import sys

import intentd
from tests import merchant


def main() -> None:
    target, key, url, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    client = intentd.Client(target, report_timeout=10)
    session = client.open_session("child", ttl=ttl)

    def execute(att: intentd.Attempt):
        order = merchant.create_order(url, att.operation_key("create-order"))
        print("EFFECT", att.token, flush=True)
        sys.stdin.readline()
        return merchant.order_result(order)

    try:
        out = session.run(intentd.Task(key=key, execute=execute, reconcile=merchant.reconcile(url)))
        print("OUTCOME", out.name, f"superseded={out.superseded}", flush=True)
    except (intentd.IntentdError, intentd.SessionLost) as e:
        print("REFUSED", type(e).__name__, flush=True)


if __name__ == "__main__":
    main()
