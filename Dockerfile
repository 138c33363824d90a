# Mnemo server (and, from the same image, the ranking sidecar).
# CPU-only torch from the PyTorch CPU index keeps the image free of CUDA.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md ./
COPY services ./services
COPY sidecar ./sidecar
COPY clients/python ./clients/python
RUN pip install .
# The search kernels compiled once, into numba's cache beside the installed module.
RUN python -c "from mnemo_server.index.kernels import compile_now; compile_now()"

# Data (DuckDB, LanceDB, the ONNX export of the embedding model) lives on a volume.
VOLUME ["/data"]
ENV MNEMO_STORAGE__DATA_DIR=/data MNEMO_SERVER__HOST=0.0.0.0
EXPOSE 50051
CMD ["mnemo", "serve"]
