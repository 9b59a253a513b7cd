# psrec, CPU image: `psrec` is the entrypoint (`docker run IMAGE train ...`,
# or the command of every pod `psrec k8s render` writes).
#
# Build and push (README, "Run on Kubernetes"):
#   docker build -t REGISTRY/psrec:VERSION .
#   docker push REGISTRY/psrec:VERSION
#
# Pinned: the base image by exact tag, and every runtime dependency of
# pyproject.toml at one exact version inside its range there
# (tests/test_dockerfiles.py checks both files against pyproject.toml).
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_USE_LEGACY_KERAS=1

# The dependencies first: a layer that changes only with these pins.
RUN pip install \
      "tensorflow==2.21.0" \
      "tf-keras==2.21.0" \
      "tensorflow-serving-api==2.21.0" \
      "tensorflow-recommenders==0.7.7" \
      "pyarrow==26.0.1" \
      "pyyaml==6.0.4" \
      "tensorboard==2.21.0" \
      "numpy==2.4.6" \
      "prometheus-client==0.26.0"

# Then psrec itself, without resolving anything again.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY psrec ./psrec
COPY data ./data
COPY features ./features
COPY models ./models
COPY ps_cluster ./ps_cluster
COPY launch ./launch
RUN pip install --no-deps . && pip check && rm -rf /src

# A non-root user with a numeric uid (Kubernetes' runAsNonRoot checks it).
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin psrec
USER 10001:10001
WORKDIR /home/psrec
ENTRYPOINT ["psrec"]
CMD ["--help"]
