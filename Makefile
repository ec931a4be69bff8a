# The README names these targets; each one installs what it needs first.
.PHONY: run test test-newest lint typecheck bench install

install:
	./scripts/bootstrap

# Run the platform locally: Redis, PostgreSQL, migrations, worker, two beat replicas, Flower,
# the operations console (its URL and a development login are printed).
run: install
	.venv/bin/platform-tasks dev

# The whole test suite against real Redis, PostgreSQL and RabbitMQ servers it starts itself.
test: install
	.venv/bin/python -m pytest

# The suite against the newest release of every runtime dependency, past pyproject's bounds.
test-newest:
	./scripts/test-newest

lint: install
	.venv/bin/ruff check platform_tasks tests bench
	.venv/bin/ruff format --check platform_tasks tests bench

typecheck: install
	.venv/bin/mypy

# Every benchmark of BENCHMARKS.md, one after the other (about 80 minutes).
bench: install
	.venv/bin/python bench/publish_vs_send_task.py --messages 5000 --rounds 5
	.venv/bin/python bench/delay_store.py --entries 10000 --batch 500
	.venv/bin/python bench/consumer_throughput.py --jobs 3000 --runs 4
	.venv/bin/python bench/transport_throughput.py --messages 2000 --rounds 5
	.venv/bin/python bench/beat_admission.py --jobs 5000 --seconds 40
	.venv/bin/python bench/beat_admission.py --jobs 500 --seconds 40
	.venv/bin/python bench/jobdocs_static_vs_runtime.py --files 2000 --repeat 5
	.venv/bin/python bench/dead_letters_purge.py --rows 500000 --batch-sizes 1000,5000,20000
	.venv/bin/python bench/rabbitmq_throughput.py --jobs 6000 --runs 8
	.venv/bin/python bench/rabbitmq_alternating.py --segment-jobs 2000 --pairs 10 --runs 3
	.venv/bin/python bench/pool_side_cpu.py --sections
	.venv/bin/python bench/claim_server_cost.py
	.venv/bin/python bench/rabbitmq_delays.py --jobs 10000 --delay 5
	.venv/bin/python bench/rabbitmq_delays.py --jobs 3000 --delay 5.5
	.venv/bin/python bench/fanout_throughput.py --tenants 10000,100000 --baseline 5000
	.venv/bin/python bench/notifications_limiter.py --calls 20000 --rounds 7
	.venv/bin/python bench/notifications_throughput.py --workers 2 --transactional 400 --marketing 4000 --chunk 10 --pace 20 --rate 48 --server-rate 50
	.venv/bin/pip install --quiet -r bench/requirements.txt
	.venv/bin/python bench/celery_baselines.py --messages 10000 --rounds 3
