FROM python:3.11-slim
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir -e .
ENV LITELLM_LOCAL_MODEL_COST_MAP=True
CMD ["artsvc", "--help"]
