# The README names these targets; each one installs what it needs first.
.PHONY: run test lint typecheck bench install

install:
	./scripts/bootstrap

# Run the platform locally: Redis, PostgreSQL, migrations, worker, two beat replicas, Flower.
run: install
	.venv/bin/platform-tasks dev

# The whole test suite against real Redis and PostgreSQL servers it starts itself.
test: install
	.venv/bin/python -m pytest

lint: install
	.venv/bin/ruff check platform_tasks tests bench
	.venv/bin/ruff format --check platform_tasks tests bench

typecheck: install
	.venv/bin/mypy

bench: install
	.venv/bin/python bench/run_all.py
