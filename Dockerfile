FROM python:3.11-slim
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends procps && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY platform_tasks ./platform_tasks
RUN pip install --no-cache-dir .
COPY celery_app.py example_maintenance.py example_maintenance.sql ./
COPY beat_schedules ./beat_schedules
RUN useradd --create-home platform
USER platform
ENV EXAMPLE_EXPORT_DIR=/tmp/platform-exports
CMD ["celery", "-A", "celery_app", "worker", "--loglevel", "INFO"]
