"""What a blast chunk's recipient claim adds to its job's transaction, on a real PostgreSQL.

Run: .venv/bin/python bench/blast_claim_cost.py [--jobs 2000] [--recipients 100] [--rounds 5]

Each round runs ``--jobs`` transactions of each kind, alternating, on one connection:
the idempotency claim every job makes (``core.claim_delivery``, the baseline) and the
same claim followed by ``claim_recipients`` of a chunk of ``--recipients`` new recipients
(what a blast chunk job adds). Reported: milliseconds per transaction, median of the
rounds, and the difference, which is the claim's cost per chunk job and per recipient.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg2

from bench._servers import bench_postgres


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--recipients", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from platform_tasks.envelope import parse_envelope, uuid7
    from platform_tasks.notifications.blast_recipients import claim_recipients
    from platform_tasks.postgres.migrations import migrate

    with bench_postgres() as pg:
        migrate(pg.url)
        conn = psycopg2.connect(pg.url)
        serial = 0

        def envelope() -> Any:
            nonlocal serial
            serial += 1
            recipients = [f"s{serial}-{n}@example.org" for n in range(args.recipients)]
            payload = {
                "job_id": str(uuid7()),
                "tenant_id": "acme",
                "correlation_id": "c",
                "kind": "bench.news",
                "data": {"campaign_id": "bench", "recipients": recipients},
            }
            return parse_envelope(payload, dict)

        def job(with_claim: bool) -> float:
            env = envelope()
            started = time.perf_counter()
            with conn, conn.cursor() as cur:
                cur.execute(
                    "SELECT * FROM core.claim_delivery(%s, %s)", (str(env.job_id), "bench.news")
                )
                if with_claim:
                    claim_recipients(env, cur)
            return time.perf_counter() - started

        for _ in range(200):  # warm-up: plans, caches
            job(True)
            job(False)
        baseline, claimed = [], []
        for _ in range(args.rounds):
            plain = with_claims = 0.0
            for _ in range(args.jobs):
                plain += job(False)
                with_claims += job(True)
            baseline.append(plain / args.jobs * 1000)
            claimed.append(with_claims / args.jobs * 1000)
        conn.close()
    base, full = statistics.median(baseline), statistics.median(claimed)
    print(f"{args.jobs} jobs x {args.rounds} rounds, {args.recipients} recipients a chunk")
    print(
        f"idempotency claim only: {base:.3f} ms per transaction (rounds "
        f"{min(baseline):.3f}-{max(baseline):.3f})"
    )
    print(f"with the recipient claim: {full:.3f} ms (rounds {min(claimed):.3f}-{max(claimed):.3f})")
    print(
        f"added per chunk job: {full - base:.3f} ms; per recipient: "
        f"{(full - base) / args.recipients * 1000:.1f} us"
    )


if __name__ == "__main__":
    main()
