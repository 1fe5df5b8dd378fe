# Triton on the CPU without NVIDIA's image: the tritonserver 2.51 binary and Python backend that
# the nvidia-pytriton wheel bundles (as `overspill up` runs it), on a Debian-based Python 3.11
# image. `make compose-test` builds it where no image registry is reachable. The models and their
# repository (stack/repository.py, --device cpu) are those of deploy/triton/Dockerfile.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
COPY deploy/triton/requirements.txt deploy/triton/requirements-nodeps.txt /tmp/
RUN pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps -r /tmp/requirements-nodeps.txt
# The Triton healthcheck calls curl; the binary loads libpython3.11 for the Python stub.
RUN command -v curl >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends curl \
      && rm -rf /var/lib/apt/lists/*; }
COPY deploy/triton/wheel-server.sh /tmp/wheel-server.sh
RUN sh /tmp/wheel-server.sh /usr/local/bin/tritonserver && rm /tmp/wheel-server.sh
COPY model_repository /tmp/model_repository
COPY stack/repository.py /tmp/repository.py
RUN python3 /tmp/repository.py --device cpu /tmp/model_repository /models \
 && rm -rf /tmp/model_repository
